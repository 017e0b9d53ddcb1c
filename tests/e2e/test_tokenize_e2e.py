"""ddp-tokenize: a real BPE trained on real text, files and meta.json checked byte for byte, refusals, and
a real 2-rank run on the output (through the CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, ddp_run, load_json, run_dirs

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
    """``python -m runner.data.tokenize <args>`` as a user would run ddp-tokenize."""
    full_env = {**os.environ, **CHECKOUT_ENV, **(env or {})}
    return subprocess.run([sys.executable, "-m", "runner.data.tokenize", *args], capture_output=True, text=True,
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


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path], subprocess.CompletedProcess]:
    """The corpus tokenized once through the real command (BPE of 1000), shared by the read-only tests."""
    base = tmp_path_factory.mktemp("tok")
    files = make_corpus(base / "corpus")
    r = tokenize_cli(str(base / "corpus"), "--out", str(base / "out"), "--vocab-size", "1000")
    assert r.returncode == 0, r.stderr
    return base / "corpus", base / "out", files, r


def test_trains_on_its_output_two_ranks(tokenized, tmp_path: Path) -> None:
    _, out, _, _ = tokenized
    r = ddp_run(["task=gpt", "device=cpu", "world_size=2", "train.max_steps=6", "checkpoint.async_save=false",
                 f"data.path={out}/train.bin", f"data.val_path={out}/val.bin", "task.model.vocab=1024"],
                tmp_path / "runs", env=CHECKOUT_ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(tmp_path / "runs")
    summary = load_json(run / "summary.json")
    assert summary["status"] == "completed" and summary["steps"] == 6
    assert summary["losses"][0] == pytest.approx(np.log(1024), abs=0.5)  # uniform over the vocabulary at init
    assert np.isfinite(summary["val_loss"])
