"""Concurrent local sweeps and search sweepers, end to end on the CPU (real ddp-run, torchrun, gloo).

One Optuna search (hydra/sweeper=ddp_search, its grid sampler asking each of the three values once, one of them
a value the plan refuses; no pruner) runs
with ``sweep.parallel=auto``: its jobs run side by side, each on its own core. The same two launched jobs run
again as an ordinary sequential sweep. Several tests read the two sweeps; a third, stopped with Ctrl-C, checks
that every running job ends with its checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from ddp_runner.contract import layout
from ddp_runner.report.compare import sweep_trials
from tests.support.driver import ddp_run
from tests.support.recipes import SMOKE_LR_SWEEP, SMOKE_LR_SWEEP_LRS, rank0_sleeps
from tests.support.run_tree import load_json
from tests.support.shared_runs import shared_run
from tests.support.waiting import wait_for

# The 1-rank jobs of the shared sequential sweep (tests/support/recipes.py: SMOKE_LR_SWEEP), run concurrently.
TINY = [*SMOKE_LR_SWEEP, "world_size=1"]
LRS = SMOKE_LR_SWEEP_LRS


def _sweep_dir(root: Path) -> Path:
    [found] = list(root.glob("*/*_sweep"))
    return found


def _jobs(sweep: Path) -> dict[str, dict[str, Any]]:
    """sweep.json's jobs by their value of train.lr."""
    return {j["values"]["train.lr"]: j for j in load_json(sweep / "sweep.json")["jobs"]}


@pytest.fixture(scope="session")
def optuna_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("optuna")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two jobs side by side need two cores")

    def make(root: Path) -> Path:
        # The grid, whose last trial may be the failed one (the refused value): the search still ends well.
        r = ddp_run(["-m", "hydra/sweeper=ddp_search", "hydra.sweeper.sampler=grid", "hydra.sweeper.seed=2",
                     "hydra.sweeper.pruner=none", f"train.lr=choice({LRS[0]},{LRS[1]},-1)", "hydra.sweeper.n_trials=3",
                     *TINY, "sweep.parallel=auto"], root, timeout=400)
        assert r.returncode == 2, r.stdout + r.stderr  # the worst job's exit code: the refused trial's
        assert "Best: job" in r.stdout, r.stdout
        return _sweep_dir(root)

    return shared_run(tmp_path_factory, "sweep-optuna-concurrent", make)


@pytest.fixture
def sequential_sweep(smoke_lr_sweep: Path) -> Path:
    """The same two jobs one after the other: the 1-rank jobs of the shared sweep (its 2-rank ones are refused)."""
    return smoke_lr_sweep


def test_concurrent_jobs_ran_at_the_same_time_on_disjoint_cores(optuna_sweep: Path) -> None:
    jobs = [j for j in _jobs(optuna_sweep).values() if j["status"] == "completed"]
    assert len(jobs) == 2
    for j in jobs:  # the cores the pool gave it are the cores its rank ran on
        assert j["cores"] and j["rank0_cpu_affinity"] == j["cores"], j
        assert j["started"] < j["ended"]
    a, b = jobs
    assert a["started"] < b["ended"] and b["started"] < a["ended"], "the two jobs overlapped in time"
    assert not set(a["cores"]) & set(b["cores"]), (a["cores"], b["cores"])


def test_concurrent_jobs_each_had_their_own_rendezvous_port(optuna_sweep: Path) -> None:
    ports = [j["rdzv_port"] for j in _jobs(optuna_sweep).values() if j["status"] == "completed"]
    assert len(ports) == 2 and all(ports) and len(set(ports)) == 2, ports


def test_every_launched_job_completed_and_the_refused_one_is_a_failed_trial(optuna_sweep: Path) -> None:
    jobs = _jobs(optuna_sweep)
    assert {lr: j["status"] for lr, j in jobs.items()} == {LRS[0]: "completed", LRS[1]: "completed",
                                                           "-1": "refused"}
    assert jobs["-1"]["objective"] is None and "train.lr" in jobs["-1"]["reason"]
    for lr in LRS:
        run = Path(jobs[lr]["run_dir"])
        assert run.parent == optuna_sweep and load_json(run / "summary.json")["status"] == "completed"
        sweep = load_json(run / "run.json")["invocation"]["sweep"]
        assert sweep == {"id": optuna_sweep.name, "dir": str(optuna_sweep), "job": jobs[lr]["job"]}
        assert (optuna_sweep / "jobs" / f"job-{jobs[lr]['job']}.log").is_file()


def test_concurrent_results_are_identical_to_the_sequential_sweep(optuna_sweep: Path, sequential_sweep: Path,
                                                                  ) -> None:
    concurrent = _jobs(optuna_sweep)
    sequential = {j["values"]["train.lr"]: j for j in load_json(sequential_sweep / "sweep.json")["jobs"]
                  if j["values"]["world_size"] == "1"}
    for lr in LRS:
        assert sequential[lr]["status"] == "completed" and "cores" not in sequential[lr]
        a = load_json(Path(concurrent[lr]["run_dir"]) / "summary.json")["losses"]
        b = load_json(Path(sequential[lr]["run_dir"]) / "summary.json")["losses"]
        assert len(a) == 3 and a == b, (lr, a, b)
        assert concurrent[lr]["objective"] == sequential[lr]["objective"] == b[-1]


def test_optuna_names_the_best_trial_that_sweep_json_names(optuna_sweep: Path) -> None:
    record = load_json(optuna_sweep / "sweep.json")
    assert record["objective"]["key"] == "final_loss" and record["objective"]["direction"] == "minimize"
    by_job = {j["job"]: j for j in record["jobs"]}
    top = by_job[record["objective"]["best"]]
    assert top["objective"] == min(j["objective"] for j in record["jobs"] if j["objective"] is not None)
    optuna = yaml.safe_load((optuna_sweep / "optimization_results.yaml").read_text())
    assert optuna["best_value"] == pytest.approx(top["objective"], rel=0, abs=0)
    assert str(optuna["best_params"]["train.lr"]) == top["values"]["train.lr"]
    trials = sweep_trials([str(optuna_sweep)])  # what ddp-compare adds to its report for a sweep directory
    assert "## Trials: final_loss (minimize)" in trials and f"Best: job {top['job']}" in trials
    assert "| refused | — (failed trial) |" in trials
    assert f"Best: job {top['job']}" in (optuna_sweep / "sweep.md").read_text()


# The Ctrl-C sweep's jobs train until the signal, each on a core of its own: a rehearsal `slow` fault (a sleep after
# every step from step 1 on) keeps the job that reaches its first step first from spinning through hundreds of
# steps while the other one starts up. The signal still finds both jobs training (steps keep coming).
IDLE_BETWEEN_STEPS = rank0_sleeps(0.1)


def test_ctrl_c_stops_every_running_job_and_each_saves_its_checkpoint(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two jobs side by side need two cores")
    root = tmp_path / "outputs"
    driver = subprocess.Popen([sys.executable, "-m", "ddp_runner", "-m", "task=smoke", "device=cpu", "world_size=1",
                               "train.max_steps=100000", "train.log_every=1000", "seed=1,2", "sweep.parallel=2",
                               *IDLE_BETWEEN_STEPS,
                               f"output.root={root}"], cwd=tempfile.gettempdir(), env=dict(os.environ),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def training() -> list[Path]:
            found = list(root.glob("*/*_sweep/*_smoke_*/logs/progress/rank0.json"))
            return found if len(found) == 2 and all(load_json(p).get("step", 0) >= 1 for p in found) else []

        wait_for("both jobs to train", training, timeout=240, driver=driver)
        driver.send_signal(signal.SIGINT)
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode != 0, out + err
    assert "stopping 2 running jobs: each saves a checkpoint" in out, out
    sweep = _sweep_dir(root)
    jobs = load_json(sweep / "sweep.json")["jobs"]
    assert [j["status"] for j in jobs] == ["interrupted", "interrupted"], jobs
    for j in jobs:
        run = Path(j["run_dir"])
        stopped = load_json(run / "logs/rank0.json")["stopped"]
        assert (run / "checkpoints" / f"step_{stopped['step']}").is_dir(), stopped
        assert load_json(run / "run.json")["status"] == "interrupted"
    wait_for("no process of the sweep left", lambda: not _processes_of(sweep), timeout=30)


def _processes_of(sweep: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["environ"]):
        try:
            if str(sweep) in (p.info["environ"] or {}).get(layout.ENV_RUN_DIR, ""):
                found.append(p)
        except psutil.Error:
            continue
    return found
