"""The dry run's printed command launches the plan it printed, typed as printed into a shell."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import load_json, run_dirs


def test_the_command_a_dry_run_prints_launches_that_plan(out_root, cli) -> None:
    dry = cli(["task=smoke", "device=cpu", "world_size=1", "train.max_steps=2", "dry_run=true"], out_root)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    printed = lines[lines.index("ddp-run: dry run, nothing launched. To launch this plan, run:") + 1].strip()
    assert shlex.split(printed)[0] == "ddp-run" and not any(a.startswith("dry_run") for a in shlex.split(printed))
    # The console script next to this interpreter (make test installs it), else the one on PATH, through a shell.
    here = Path(sys.executable).parent / "ddp-run"
    exe = str(here) if here.exists() else shutil.which("ddp-run")
    assert exe is not None, "the ddp-run console script is not installed (pip install -e .)"
    r = subprocess.run(shlex.join([exe]) + printed.removeprefix("ddp-run"), shell=True, cwd=tempfile.gettempdir(),
                       env=os.environ, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(out_root)
    manifest = load_json(run / "run.json")
    assert manifest["status"] == "completed"
    assert manifest["plan"]["world_size"] == 1 and manifest["plan"]["global_batch"] == 8
    assert not any(a.startswith("dry_run") for a in manifest["invocation"]["argv"])
