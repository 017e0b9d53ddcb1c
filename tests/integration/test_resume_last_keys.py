"""Issue 45 item 3 through ``ddp_runner.cli.main()`` in this process (dry runs and refusals: nothing launched):
``resume=last task=gpt`` used to continue the newest (smoke) run and only warn that ``task=gpt`` was ignored. The
keys beside ``resume=last`` now choose among the unfinished runs (the newest whose values match), or the resume is
refused naming the candidates; either way no run directory is created and the candidates are left as they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.run_tree import run_dirs


def _unfinished(smoke_reference: Path, root: Path, name: str, seed: int) -> Path:
    run = root / "2026-01-01" / name
    shutil.copytree(smoke_reference, run)
    manifest = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**manifest, "status": "interrupted"}))
    conf = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**conf, "seed": seed}, sort_keys=False))
    return run


@pytest.fixture
def two_smoke_runs(tmp_path: Path, smoke_reference: Path) -> tuple[Path, Path]:
    """(older with seed 5, newer with seed 7): two interrupted copies of the shared smoke run."""
    root = tmp_path / "root"
    return (_unfinished(smoke_reference, root, "10-00-00_smoke_w2", 5),
            _unfinished(smoke_reference, root, "11-00-00_smoke_w2", 7))


def test_a_task_no_unfinished_run_has_is_refused_naming_the_candidates(two_smoke_runs: tuple[Path, Path], cli):
    older, newer = two_smoke_runs
    before = {p: (p / "run.json").read_text() for p in two_smoke_runs}
    r = cli(["resume=last", "task=gpt", "dry_run=true"], older.parent.parent)
    assert r.returncode == 2, r.stdout + r.stderr  # was: 0, continuing the newer smoke run, "ignored: task=gpt"
    assert "ddp-run: refused: resume='last': no unfinished run under output.root=" in r.stderr
    assert "has task=gpt;" in r.stderr and "ignored" not in r.stderr
    assert f"{newer} (interrupted; task=smoke)" in r.stderr and f"{older} (interrupted; task=smoke)" in r.stderr
    assert "continuing" not in r.stdout
    assert run_dirs(older.parent.parent) == [older, newer]
    assert {p: (p / "run.json").read_text() for p in two_smoke_runs} == before


def test_keys_beside_resume_last_choose_the_newest_matching_run(two_smoke_runs: tuple[Path, Path], cli):
    older, newer = two_smoke_runs
    root = older.parent.parent
    r = cli(["resume=last", "seed=5", "dry_run=true"], root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resume=last: continuing {older} (the newest unfinished run with seed=5)" in r.stdout
    r = cli(["resume=last", "task=smoke", "train.log_every=2", "dry_run=true"], root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resume=last: continuing {newer} (the newest unfinished run with task=smoke)" in r.stdout
    assert "ignored" not in r.stderr, "the key that chose the run is not a setting ignored"
    assert "changed on resume: train.log_every 1 -> 2" in r.stdout  # a setting it may change still applies
    r = cli(["resume=last", "dry_run=true"], root)
    assert r.returncode == 0 and f"resume=last: continuing {newer}\n" in r.stdout, r.stdout + r.stderr
    assert run_dirs(root) == [older, newer]
