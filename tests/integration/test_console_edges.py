"""The console scripts as typed on an ASCII console (``LC_ALL=C PYTHONIOENCODING=ascii``) and into a pipe whose
reader has gone (``| head``): the same exit code as on a good console, plain ASCII in place of ``×`` and ``⚠``, and
never a traceback (runner/contract/console_streams.py; docs/run-tree.md, "The console is never the run's weak
point"). Each case is a new interpreter: the streams are the interpreter's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ddp_runner.contract import layout
from tests.support.doc_commands import scripts

ASCII_CONSOLE = {"LC_ALL": "C", "PYTHONIOENCODING": "ascii"}
DRY_RUN = ["task=smoke", "device=cpu", "world_size=2", "train.max_steps=2", "dry_run=true"]


def _typed(script: str, args: list[str], env: dict[str, str] | None = None, reader_gone: bool = False,
           closed: bool = False) -> subprocess.CompletedProcess[bytes]:
    """``script args`` as its console script runs it; ``reader_gone``: its stdout is a pipe whose reader closed
    before the first line (``| head -0``); ``closed``: it starts without a stdout (``>&-``)."""
    module, function = scripts()[script].split(":")
    code = f"import sys; from {module} import {function}; sys.argv[0] = {script!r}; sys.exit({function}())"
    cmd = [sys.executable, "-c", code, *args]
    full_env = {**os.environ, **(env or {})}
    if not reader_gone:
        return subprocess.run(cmd, capture_output=True, env=full_env, cwd=tempfile.gettempdir(), timeout=120,
                              preexec_fn=(lambda: os.close(1)) if closed else None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
                            cwd=tempfile.gettempdir())
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, b"", err)


def _clean(result: subprocess.CompletedProcess[bytes]) -> str:
    """Everything it printed, asserted free of tracebacks and of the interpreter's complaint at exit."""
    text = (result.stdout + result.stderr).decode("ascii", "replace")
    for word in ("Traceback", "UnicodeEncodeError", "BrokenPipeError", "Exception ignored"):
        assert word not in text, text[-2000:]
    return text


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An output root holding one completed and one failed run (as far as ddp-runs and ddp-compare read them)."""
    root = tmp_path_factory.mktemp("console-edges") / "outputs"
    for name, status in (("12-00-00_smoke_w1", layout.STATUS_COMPLETED), ("12-00-01_smoke_w2", layout.STATUS_FAILED)):
        run = root / "2026-12-05" / name
        run.mkdir(parents=True)
        world = int(name[-1])
        plan = {"world_size": world, "per_rank_batch": 16 // world, "accumulation": 1, "global_batch": 16,
                "device": "cpu"}
        (run / layout.MANIFEST).write_text(json.dumps({"status": status, "task": "smoke", "plan": plan}))
        (run / layout.SUMMARY).write_text(json.dumps({"status": status, "global_batch": 16, "steps": 4,
                                                      "losses": [1.0, 0.8, 0.6, 0.5],
                                                      "median": {"step_time_s": 0.1 / world}}))
    return root


def test_a_dry_run_and_a_refusal_on_an_ascii_console(tmp_path: Path) -> None:
    """The plan's ``8 per rank × 2 ranks`` reads ``8 per rank x 2 ranks``; a refusal still exits 2 with its lines."""
    dry = _typed("ddp-run", [*DRY_RUN, f"output.root={tmp_path}"], ASCII_CONSOLE)
    assert dry.returncode == 0, _clean(dry)
    assert "global batch 16 = 8 per rank x 2 ranks x 1 accumulation" in _clean(dry)
    refused = _typed("ddp-run", ["task=smoke", "device=cpu", "world_size=3", "batch.global=7",
                                 f"output.root={tmp_path}"], ASCII_CONSOLE)
    assert refused.returncode == layout.EXIT_REFUSED, _clean(refused)
    assert "batch.global" in _clean(refused)


def test_ddp_compare_and_ddp_runs_on_an_ascii_console(runs: Path, tmp_path: Path) -> None:
    """ddp-compare marks the failed run ``failed !`` (``⚠`` on a UTF-8 console) and writes its report; ddp-runs lists
    both runs."""
    compared = _typed("ddp-compare", [str(runs), "--out", str(tmp_path / "report")], ASCII_CONSOLE)
    assert compared.returncode == 0, _clean(compared)
    assert "failed !" in _clean(compared)
    assert "⚠" in (tmp_path / "report" / "report.md").read_text(encoding="utf-8")  # the file is UTF-8 as ever
    listed = _typed("ddp-runs", [str(runs)], ASCII_CONSOLE)
    assert listed.returncode == 0, _clean(listed)
    assert "12-00-01_smoke_w2" in _clean(listed)


@pytest.mark.parametrize("script", ["ddp-runs", "ddp-compare", "ddp-run"])
def test_a_reader_that_went_away_ends_nothing_early(script: str, runs: Path, tmp_path: Path) -> None:
    """``ddp-runs --json | head``, ``ddp-compare … | head``, a dry run ``| head``: the exit code of a good console,
    no traceback, and ddp-compare's files written all the same."""
    args = {"ddp-runs": [str(runs), "--json"], "ddp-compare": [str(runs), "--out", str(tmp_path / "report")],
            "ddp-run": [*DRY_RUN, f"output.root={tmp_path}"]}[script]
    result = _typed(script, args, reader_gone=True)
    _clean(result)
    assert result.returncode == 0
    if script == "ddp-compare":
        assert (tmp_path / "report" / "report.md").exists()



def test_a_driver_started_without_a_stdout_plans(tmp_path: Path) -> None:
    """``ddp-run … >&-``: the interpreter has no sys.stdout at all (it used to end in an AttributeError before the
    launch); the null device takes descriptor 1, so that no file the driver opens later (a child's log) takes it."""
    dry = _typed("ddp-run", [*DRY_RUN, f"output.root={tmp_path}"], closed=True)
    assert dry.returncode == 0, _clean(dry)
    _clean(dry)
