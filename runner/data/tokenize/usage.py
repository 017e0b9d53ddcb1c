"""ddp-tokenize's terms: its name, the vocabulary it can write (uint16 ids), its refusal and its status lines."""

from __future__ import annotations

import sys

from ddp_runner.contract import textfit
from ddp_runner.contract.errors import PlanError

PROG = "ddp-tokenize"
DEFAULT_GLOBS = ("*.txt", "*.md", "*.rst", "*.py")
DEFAULT_VOCAB = 8192
# uint16 holds ids 0..65535; 65535 itself stays free (a sentinel some tools use), hence the bound.
MAX_VOCAB = 65535
MIN_VOCAB = 257  # the 256 byte tokens a byte-level BPE starts from, plus <|endoftext|>
EOT = "<|endoftext|>"
EXIT_USAGE = 2
DEFAULT_TRAIN_BYTES = 1 << 30  # a BPE learns its merges well from a GB; more costs memory and minutes


class UsageError(PlanError):
    """A refusal of an option (the runner's refusal: key, value, problem, fix), worded for a shell."""

    def __str__(self) -> str:
        return f"{self.key}={self.value}: {self.problem}. Fix: {self.fix}"


def say(msg: str) -> None:
    """A status line on stderr (stdout carries only the final summary)."""
    textfit.say(f"{PROG}: {msg}", sys.stderr, flush=True)


def human(n: int) -> str:
    """Bytes for people: 950 B, 12.3 MB."""
    if n < 1000:
        return f"{n} B"
    size, units = float(n), ("KB", "MB", "GB", "TB")
    for unit in units:
        size /= 1000
        if size < 1000 or unit == units[-1]:
            break
    return f"{size:.1f} {unit}"

