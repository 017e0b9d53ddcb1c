"""A corpus of real text tokenized once per test session through the real ``ddp-tokenize`` (a BPE of 1000), shared
by the read-only tokenizer tests of every tier, and the helpers that make and tokenize such a corpus."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The CLI in a subprocess must import this checkout (not another install of the package).
CHECKOUT_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# ~230 KB of real text in 23 documents of 0.3-32 KB: a BPE trains on it in well under a second.
MODULES = ("abc", "bisect", "colorsys", "copy", "fnmatch", "glob", "heapq", "keyword", "numbers", "operator",
           "queue", "random", "shlex", "string", "textwrap", "graphlib", "reprlib", "sched", "stat", "struct",
           "token", "types", "weakref")
NOTES = "# Notes\n\nUnicode survives: café, naïve, 東京, 🙂.\nA literal <|endoftext|> in text is just text.\n"


def tokenize_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
                 ) -> subprocess.CompletedProcess[str]:
    """``python -m ddp_runner.data.tokenize <args>`` as a user would run ddp-tokenize."""
    full_env = {**os.environ, **CHECKOUT_ENV, **(env or {})}
    return subprocess.run([sys.executable, "-m", "ddp_runner.data.tokenize", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or ROOT, timeout=120)


def make_corpus(root: Path) -> list[Path]:
    """A folder of text as users have it; returns the files ddp-tokenize must take, in its order."""
    (root / "code").mkdir(parents=True)
    for name in MODULES:
        (root / "code" / f"{name}.py").write_bytes((STDLIB / f"{name}.py").read_bytes())
    (root / "notes").mkdir()
    (root / "notes" / "readme.md").write_text(NOTES, encoding="utf-8")
    # Not taken: hidden folders, other extensions, binary files.
    (root / ".git").mkdir()
    (root / ".git" / "HEAD.txt").write_text("ref: refs/heads/main\n")
    (root / "notes" / "table.csv").write_text("a,b\n1,2\n")
    (root / "blob.bin").write_bytes(bytes(range(256)))
    return sorted([*(root / "code").glob("*.py"), root / "notes" / "readme.md"],
                  key=lambda p: p.relative_to(root).as_posix())


@pytest.fixture(scope="session")
def tokenized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path], subprocess.CompletedProcess]:
    """The corpus tokenized once through the real command (BPE of 1000), shared by the read-only tests."""
    base = tmp_path_factory.mktemp("tok")
    files = make_corpus(base / "corpus")
    r = tokenize_cli(str(base / "corpus"), "--out", str(base / "out"), "--vocab-size", "1000")
    assert r.returncode == 0, r.stderr
    return base / "corpus", base / "out", files, r
