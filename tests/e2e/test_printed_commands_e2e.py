"""Issue 51 item 4, typed into a shell as printed: the dry run's torchrun line with RUN_DIR set to a folder that
holds only config.yaml and run.json (it makes the logs it needs), and the command a completed run's refusal names,
for a run in a folder named like a sweep's job (``=``, a non-ASCII letter). A run continued in place keeps the
command that started it, which ``ddp-runs show`` then gives as ``reproduce`` (the in-process tier runs every other
printed shape: tests/integration/test_printed_commands.py)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_runner.contract import layout
from ddp_runner.report import runs
from tests.support.driver import cli_in_process
from tests.support.recipes import DRY_RUN_SAYS
from tests.support.run_tree import load_json
from tests.support.shared_runs import shared_console


def _exe() -> str:
    here = Path(sys.executable).parent / "ddp-run"
    found = str(here) if here.exists() else shutil.which("ddp-run")
    assert found, "the ddp-run console script is not installed (pip install -e .)"
    return found


def test_the_dry_runs_torchrun_line_runs_in_a_folder_holding_config_and_run_json(tmp_path: Path,
                                                                                  smoke_w1_typed: Path) -> None:
    lines = shared_console(smoke_w1_typed)["dry"]["stdout"].splitlines()
    line = lines[lines.index(DRY_RUN_SAYS) + 3].strip()
    assert line.startswith("env ") and "$RUN_DIR" in line, line
    folder = tmp_path / "by hand"
    folder.mkdir()
    for name in (layout.CONFIG, layout.MANIFEST):
        shutil.copy(smoke_w1_typed / name, folder / name)
    r = subprocess.run(["bash", "-c", line], cwd=tmp_path, env={**os.environ, "RUN_DIR": str(folder)},
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FileNotFoundError" not in r.stdout + r.stderr
    assert "completed" in (folder / layout.rank_log(0)).read_text()
    assert (folder / layout.CHECKPOINTS / "step_2").is_dir()


def test_a_completed_runs_refusal_names_a_command_that_continues_it(
        tmp_path: Path, smoke_reference: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "sweep" / "0_smoke_w2_seed=1_é"
    shutil.copytree(smoke_reference, run)
    started = load_json(run / layout.MANIFEST)["invocation"]
    refused = cli_in_process([f"resume='{run}'"], tmp_path / "unused", monkeypatch)
    assert refused.returncode == 2, refused.stderr
    fix = refused.stderr.split("raise train.max_steps: ", 1)[1].split(" (continues", 1)[0]
    assert shlex.split(fix)[0] == "ddp-run", fix
    r = subprocess.run(shlex.join([_exe()]) + fix.removeprefix("ddp-run"), shell=True, cwd=tmp_path,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert load_json(run / "summary.json")["steps"] == 16
    manifest = load_json(run / layout.MANIFEST)
    assert manifest["first_invocation"] == started and "resume=" in " ".join(manifest["invocation"]["overrides"])
    assert runs.main(["show", str(run)]) == 0
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("reproduce ")]
    assert "resume=" not in line and line.endswith(shlex.join(["ddp-run", *started["overrides"]])[len("ddp-run"):])
