"""A run's checkpoints folder as the driver reads it before launch: the complete checkpoints, and every other
``step_<N>`` entry passed over with the reason (a stray file, a save that never committed, an invalid marker).

The rule is the contract's (runner/contract/checkpoints.py, ``entry_problem``), the one the workers' storage
applies (they also validate each marker): a reader never trips over what is not a checkpoint, and says what it
skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddp_runner.contract import checkpoints, layout


@dataclass(frozen=True)
class Listing:
    """``complete``: (step, name) of the complete checkpoints, oldest first; ``skipped``: (name, why) of the other
    ``step_<N>`` entries."""

    complete: list[tuple[int, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def newest(self) -> str | None:
        """The newest complete checkpoint's name, None when there is none."""
        return self.complete[-1][1] if self.complete else None

    def notes(self) -> list[str]:
        """One note per entry passed over (the contract's words)."""
        return [checkpoints.skipped_note(name, why) for name, why in self.skipped]


def scan(fs: Any, ckpts: str) -> Listing:
    """The checkpoints folder at ``ckpts`` (a path on ``fs``); an empty listing when there is no such folder. A
    ``step_<N>/`` counts once its ``meta.json`` exists: the driver never reads a marker (the workers validate it,
    and fall back past one that fails)."""
    ckpts = ckpts.rstrip("/")
    fs.invalidate_cache(ckpts)  # an object store's cached listing may predate the last commit
    try:
        entries = fs.ls(ckpts, detail=True)
        committed = {m.rstrip("/").rsplit("/", 2)[-2] for m in fs.glob(layout.join(ckpts, "step_*",
                                                                                   layout.CKPT_MARKER))}
    except (FileNotFoundError, NotADirectoryError):
        return Listing()
    complete, skipped = [], []
    for entry in entries:
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        if (step := checkpoints.step_of(name)) is None:
            continue  # a save's temporary sibling: the workers' business
        is_dir = entry.get("type") == "directory"
        if (why := checkpoints.entry_problem(name, is_dir, is_dir and name in committed)) is None:
            complete.append((step, name))
        else:
            skipped.append((step, name, why))
    return Listing(sorted(complete), [(name, why) for _, name, why in sorted(skipped)])


def of_run(fs: Any, run: str) -> Listing:
    """The checkpoints folder of run directory ``run`` (a path on ``fs``)."""
    return scan(fs, layout.join(run.rstrip("/"), layout.CHECKPOINTS))
