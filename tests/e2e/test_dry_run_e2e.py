"""The dry run's printed command launches the plan it printed, typed as printed into a shell (the launch is shared
with test_cli.py's re-run from a run directory: tests/e2e/conftest.py, ``smoke_w1_typed``)."""

from __future__ import annotations

import shlex

from tests.support.recipes import DRY_RUN_SAYS
from tests.support.run_tree import load_json
from tests.support.shared_runs import shared_console


def test_the_command_a_dry_run_prints_launches_that_plan(smoke_w1_typed) -> None:
    run, console = smoke_w1_typed, shared_console(smoke_w1_typed)
    dry = console["dry"]
    assert dry["rc"] == 0, dry["stderr"]
    lines = dry["stdout"].splitlines()
    printed = lines[lines.index(DRY_RUN_SAYS) + 1].strip()
    assert printed == console["printed"]
    assert shlex.split(printed)[0] == "ddp-run" and not any(a.startswith("dry_run") for a in shlex.split(printed))
    # The console script next to this interpreter (make test installs it), else the one on PATH, through a shell.
    assert console["exe"] is not None, "the ddp-run console script is not installed (pip install -e .)"
    assert console["rc"] == 0, console["stdout"] + console["stderr"]
    manifest = load_json(run / "run.json")
    assert manifest["status"] == "completed"
    assert manifest["plan"]["world_size"] == 1 and manifest["plan"]["global_batch"] == 8
    assert not any(a.startswith("dry_run") for a in manifest["invocation"]["argv"])
