"""Issue 30, what needs a real launch (one, shared): SIGHUP (a closed terminal or ssh session) stops the run like
SIGTERM, with its checkpoint and a truthful record; ``debug=true`` keeps c10d's lines out of the world-readable
files; torchrun's ``torchelastic_*`` temporary folder does not outlive the run."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.recipes import rank0_sleeps
from tests.support.run_tree import load_json, run_dirs

ARGS = ["task=smoke", "device=cpu", "world_size=2", "debug=true", "checkpoint.every_steps=0",
        *rank0_sleeps(0.4)]


@pytest.fixture(scope="module")
def hung_up(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, str, Path, Path]:
    """A debug run whose driver gets SIGHUP at step 2, with a temporary folder of its own."""
    base = tmp_path_factory.mktemp("hup")
    tmp, root = base / "tmp", base / "outputs"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "ddp_runner", *ARGS, f"output.root={root}"], cwd=tmp,
                            env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if re.match(r"\s*step 2/", line):
            break
    else:
        pytest.fail(f"the run ended before step 2:\n{''.join(seen)}\n{proc.stderr.read()}")
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=120)
    [run] = run_dirs(root)
    return proc.returncode, "".join(seen) + out, err, run, tmp


def test_sighup_stops_like_sigterm_with_its_checkpoint(hung_up: tuple[int, str, str, Path, Path]) -> None:
    code, out, err, run, _ = hung_up
    assert code == 128 + signal.SIGHUP, out + err
    assert "stopping on SIGHUP" in err and "Traceback" not in err, err
    manifest, summary = load_json(run / "run.json"), load_json(run / "summary.json")
    assert manifest["status"] == summary["status"] == "interrupted"
    stopped = load_json(run / "logs/rank0.json")["stopped"]
    assert (run / "checkpoints" / f"step_{stopped['step']}" / "meta.json").is_file(), stopped
    assert f"ddp-run resume={run}" in err


def test_debug_lines_stay_in_owner_only_files(hung_up: tuple[int, str, str, Path, Path]) -> None:
    _, _, _, run, _ = hung_up
    agent = run / "logs/debug/agent.log"
    assert "c10d" in agent.read_text() and stat.S_IMODE(agent.stat().st_mode) == 0o600
    for p in run.rglob("*"):
        if p.is_file() and p.stat().st_mode & stat.S_IROTH and p.suffix in (".log", ".json", ".txt", ".yaml"):
            text = p.read_text(errors="replace")
            assert not re.search(r"\[c10d( - trace)?\]|TCPStore", text), p


def test_torchrun_temporary_folders_are_removed(hung_up: tuple[int, str, str, Path, Path]) -> None:
    _, _, _, _, tmp = hung_up
    left = [p.name for p in tmp.iterdir() if p.name.startswith(("torchelastic_", "ddp-run-agent-"))]
    assert left == []
