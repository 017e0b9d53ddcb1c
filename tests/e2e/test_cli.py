"""The CLI as a user meets it, through ``python -m ddp_runner``: a refusal is exit 2 of a real process with nothing
created (one of each kind: the plan's rules, Hydra's composition, a swept value), task modules found from the
working directory, a dry run, help, and a run directory re-run from its own config. The rest of the refusals,
dry runs and flags go through ``main()`` in process: tests/integration/test_cli_inproc.py.

Of a parametrized refusal, one case is a real ``python -m ddp_runner`` (its exit code, what a shell user sees);
the others, which end on the same path before anything is launched, call ``main()`` in process
(``cli_in_process``: ~0.7 CPU-s less each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.driver import cli_in_process, ddp_run
from tests.support.run_tree import run_dirs
from tests.support.shared_runs import shared_console


@pytest.mark.parametrize("args, key, value, real", [
    (["device=cpu", "world_size=0"], "world_size", "0", False),  # the plan's rules
    # Hydra cannot compose it: Hydra's own exit 1 and its text, held back and turned into the refusal (the path
    # with the most process-level machinery: stderr swapped, SystemExit rewritten), so the real process's.
    (["device=cpu", "batch.perrank=3"], "batch.perrank", "'3'", True),
    (["-m", "task=smoke,nope", "device=cpu"], "task", "'nope'", False),  # a swept value, before the first job
])
def test_a_refusal_is_exit_2_of_the_real_cli_and_creates_nothing(args, key, value, real, out_root, monkeypatch):
    r = ddp_run(args, out_root) if real else cli_in_process(args, out_root, monkeypatch)
    assert r.returncode == 2, r.stderr
    assert f"key:   {key}" in r.stderr and f"value: {value}" in r.stderr and "fix:" in r.stderr
    assert "Traceback" not in r.stderr
    assert not out_root.exists(), "a refused plan must leave no directory"


def test_dry_run_prints_plan_and_command_and_launches_nothing(out_root):
    r = ddp_run(["device=cpu", "batch.per_rank=4", "batch.global=32", "dry_run=true"], out_root)
    assert r.returncode == 0, r.stderr
    assert "global batch 32 = 4 per rank × 2 ranks × 4 accumulation" in r.stdout
    assert "--nproc-per-node=2" in r.stdout and "-m ddp_runner.tasks" in r.stdout
    assert not out_root.exists()


def test_help_lists_config_groups(out_root):
    r = ddp_run(["--help"], out_root)
    assert r.returncode == 0
    for group in ("task:", "data:", "launcher:", "smoke"):
        assert group in r.stdout
    assert run_dirs(out_root.parent) == []


# -- task modules -----------------------------------------------------------------------------------------------

# The real process for one case: its working directory on sys.path (``python -m``), as a user's. In process, a
# module name of each case's own: this interpreter's sys.modules may hold a "mytask" another test imported, which
# find_spec would return.
@pytest.mark.parametrize("source, problem, real", [
    (None, "no such module", False),
    ("def make(cfg, device):\n    pass\n", "defines no build()", True),
    ("import no_such_package_xyz\n\ndef build(cfg, device):\n    pass\n", "no_such_package_xyz", False),
    ("def build(cfg, device)\n", "SyntaxError", False),
])
def test_task_module_problems_are_refused_before_launch(out_root, tmp_path, monkeypatch, source, problem, real):
    module = "mytask" if real else f"e2e_cli_task_{tmp_path.name.replace('-', '_').replace('.', '_')}"
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    args = [f"task.module={module}", "device=cpu"]
    if real:
        r = subprocess.run([sys.executable, "-m", "ddp_runner", *args, f"output.root={out_root}"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    else:
        r = cli_in_process(args, out_root, monkeypatch, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "key:   task.module" in r.stderr and problem in r.stderr, r.stderr
    assert not out_root.exists()


def test_a_run_directory_reruns_its_exact_config(smoke_w1_typed, tmp_path):
    """The run's saved config.yaml, given back with --config-dir, is not shadowed by the package's own. The first
    run: test_dry_run_e2e.py's launch (1 rank, train.max_steps=2, not the package's 8 steps; tests/e2e/conftest.py)."""
    import json

    first = shared_console(smoke_w1_typed)
    assert first["rc"] == 0, first["stderr"]
    run = smoke_w1_typed
    again_root = tmp_path / "again"
    r = ddp_run(["--config-dir", str(run), "--config-name", "config"], again_root)
    assert r.returncode == 0, r.stderr
    (rerun,) = run_dirs(again_root)

    def without_root(p: Path) -> list[str]:
        return [ln for ln in (p / "config.yaml").read_text().splitlines() if "root:" not in ln]

    assert without_root(rerun) == without_root(run)
    manifest = json.loads((rerun / "run.json").read_text())
    assert manifest["invocation"]["config_sources"][0] == str(run)
    assert manifest["invocation"]["argv"][:3] == ["ddp-run", "--config-dir", str(run)]


def test_an_object_store_without_credentials_is_refused_in_one_sentence(out_root, tmp_path):
    env = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    # A real process (what a shell user sees, a traceback that botocore's logging would print included), with no
    # AWS credentials anywhere and no fsspec filesystem cached from another test.
    full = {k: v for k, v in {**os.environ, **env}.items() if v != ""}
    r = subprocess.run([sys.executable, "-m", "ddp_runner", "device=cpu",
                        "output.root=s3://ddp-runner-no-such-bucket/x"],
                       capture_output=True, text=True, timeout=120, env=full, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "key:   output.root" in r.stderr and "credentials" in r.stderr and "Traceback" not in r.stderr
