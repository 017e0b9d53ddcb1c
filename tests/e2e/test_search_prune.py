"""An early-stopping search end to end (hydra/sweeper=ddp_search): three trials of the tiny GPT, two side by side,
one learning rate that trains and two that diverge. A diverged trial is pruned at its first validation: it saves a
checkpoint, ends ``pruned`` (exit 0, not failed nor interrupted), and its slot goes to the next trial while the
good one still runs; sweep.json says each trial's state and the steps saved. One launch, shared by the tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.driver import ddp_run
from tests.support.recipes import rank0_sleeps
from tests.support.run_tree import load_json
from tests.support.shared_runs import shared_run

GOOD, BAD = "0.003", ("1000.0", "2000.0")
STEPS = 60
# The grid's order with seed 1: the good trial and a diverging one first, the other diverging one third.
SEARCH = ["-m", "hydra/sweeper=ddp_search", "hydra.sweeper.sampler=grid", "hydra.sweeper.seed=1",
          f"train.lr=choice({GOOD},{BAD[0]},{BAD[1]})", "hydra.sweeper.n_trials=3", "task=gpt", "device=cpu",
          "world_size=1", f"train.max_steps={STEPS}", "train.val_every=5", "train.val_samples=64",
          "sweep.parallel=2",
          # Every step takes 0.15 s (the rehearsal slow fault): the good trial's 60 steps outlast a pruned trial's
          # end and the next trial's start however fast the machine, so the slot's reuse shows in the times.
          *rank0_sleeps(0.15)]


@pytest.fixture(scope="session")
def pruned_search(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    pytest.importorskip("optuna")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two trials side by side need two cores")

    def make(root: Path) -> Path:
        r = ddp_run(SEARCH, root, timeout=400)
        assert r.returncode == 0, r.stdout + r.stderr  # a pruned trial is a normal end of a search's trial
        (root / "console.txt").write_text(r.stdout + r.stderr)
        [found] = list(root.glob("*/*_sweep"))
        return found

    sweep = shared_run(tmp_path_factory, "search-pruned", make)
    return sweep, (sweep.parent.parent / "console.txt").read_text()


def _jobs(sweep: Path) -> dict[str, dict[str, Any]]:
    return {j["values"]["train.lr"]: j for j in load_json(sweep / "sweep.json")["jobs"]}


def test_a_diverged_trial_ends_pruned_with_its_checkpoint(pruned_search: tuple[Path, str]) -> None:
    sweep, console = pruned_search
    jobs = _jobs(sweep)
    assert jobs[GOOD]["status"] == "completed" and jobs[GOOD]["figures"]["steps"] == STEPS
    for lr in BAD:
        job = jobs[lr]
        run = Path(job["run_dir"])
        assert job["status"] == "pruned" and job["pruned"]["step"] == 5 and job["pruned"]["value"] == "nan", job
        assert load_json(run / "run.json")["status"] == "pruned"
        assert load_json(run / "summary.json")["status"] == "pruned"
        stopped = load_json(run / "summary.json")["stopped"]
        assert (run / "checkpoints" / stopped["checkpoint"] / "meta.json").is_file()
        assert job["figures"]["steps"] < STEPS and job["exit_code"] == 0
        assert f"job {job['job']} pruned at step 5" in console


def test_a_pruned_trials_slot_went_to_the_next_trial_while_the_good_one_ran(
        pruned_search: tuple[Path, str]) -> None:
    jobs = sorted(_jobs(pruned_search[0]).values(), key=lambda j: j["job"])
    first_two, third = jobs[:2], jobs[2]
    assert {j["values"]["train.lr"] for j in first_two} == {GOOD, BAD[0]} or GOOD in {
        j["values"]["train.lr"] for j in first_two}, jobs
    good = next(j for j in jobs if j["values"]["train.lr"] == GOOD)
    pruned_first = next(j for j in first_two if j is not good)
    assert pruned_first["ended"] <= third["started"] < good["ended"]  # no waiting for a batch


def test_the_search_record_counts_states_and_the_steps_saved(pruned_search: tuple[Path, str]) -> None:
    sweep, _ = pruned_search
    record = load_json(sweep / "sweep.json")
    search = record["search"]
    assert search["trials"] == {"completed": 1, "pruned": 2} and search["pruner"] == "median"
    steps = search["steps"]
    assert steps["unpruned"] == 3 * STEPS and steps["ran"] == sum(j["figures"]["steps"] for j in record["jobs"])
    assert steps["saved"] == steps["unpruned"] - steps["ran"] > 0
    assert record["objective"]["best"] == _jobs(sweep)[GOOD]["job"]
    assert (sweep / "study.journal").is_file()
    md = (sweep / "sweep.md").read_text()
    assert "pruned at step 5" in md and "Optimizer steps:" in md


def test_a_pruned_trial_is_continued_like_any_run(pruned_search: tuple[Path, str], tmp_path: Path) -> None:
    source = Path(_jobs(pruned_search[0])[BAD[0]]["run_dir"])
    run = tmp_path / "pruned_trial"  # a copy: the shared search stays as it ended
    shutil.copytree(source, run)
    stopped = load_json(run / "summary.json")["stopped"]["step"]
    r = ddp_run([f"resume='{run}'"], tmp_path)  # quoted: the name holds '='
    assert r.returncode == 0, r.stdout + r.stderr
    summary = load_json(run / "summary.json")
    assert summary["status"] == "completed" and summary["steps"] == STEPS and "pruned" not in summary
    assert summary["resumed_from"].endswith(f"step_{stopped}")
