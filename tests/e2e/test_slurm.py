"""launcher=slurm against a real Slurm on localhost (tests/slurm_cluster.py: munged, slurmctld and two slurmd's,
nodes n1 and n2): a 2-node job runs to completion, a sweep becomes separate jobs, scancel mid-run leaves a truthful
run directory and no process, and a requeued job resumes from its checkpoint."""

from __future__ import annotations

import functools
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from ddp_runner.contract import layout
from tests.support import ports, slurm_cluster, waiting
from tests.support.driver import ddp_run
from tests.support.recipes import rank0_sleeps
from tests.support.run_tree import load_json, run_dirs

# One local Slurm per session: every test of this file on the same xdist worker (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("slurm")

SMOKE = ["task=smoke", "device=cpu", "world_size=2", "launcher=slurm", "launcher.nodes=2", "timeout_s=60"]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local Slurm for the whole session; skipped, with the reason, where it cannot run."""
    reason = slurm_cluster.why_not()
    if reason:
        pytest.skip(reason)
    env = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    try:
        yield env
    finally:
        slurm_cluster.drain({**os.environ, **env})
        slurm_cluster.stop(Path(env["SLURM_CONF"]).parent)


wait_for = functools.partial(waiting.wait_for, timeout=240, interval=0.5)  # Slurm's commands are slow to ask


def rdzv_base() -> int:
    """A ``launcher.rdzv_port`` for a test's jobs (each listens on it + its job id % 1000). Random: job ids start at 1
    on every test cluster, and one machine may run several. From :func:`tests.support.ports.quiet_range`, whose
    ``high`` leaves room for the 999 above it (the module says why)."""
    low, high = ports.quiet_range()
    return random.SystemRandom().randint(low, high)


def _json(path: Path) -> dict[str, Any]:
    try:
        return load_json(path)
    except (OSError, ValueError):
        return {}


def _procs_of(run: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["environ"]):
        try:
            if str(run) in (p.info["environ"] or {}).get(layout.ENV_RUN_DIR, ""):
                found.append(p)
        except psutil.Error:
            continue
    return found


def test_a_two_node_job_runs_the_smoke_task_to_completion(slurm, out_root):
    r = ddp_run([*SMOKE, "train.epochs=1"], out_root, env=slurm)
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(out_root)
    assert r.stdout.strip().splitlines()[-1] == str(run)
    job = load_json(run / layout.SLURM_JOB)
    assert f"submitted Slurm job {job['job_id']}" in r.stdout and "completed: 4 steps, 2 ranks" in r.stdout
    script = (run / layout.SLURM_SCRIPT).read_text()
    assert "#SBATCH --nodes=2" in script and "-m ddp_runner.launch.slurm" in script
    manifest, summary = load_json(run / "run.json"), load_json(run / "summary.json")
    assert manifest["status"] == summary["status"] == "completed"
    assert manifest["slurm"]["job_id"] == job["job_id"] and manifest["slurm"]["nodes"] == ["n1", "n2"]
    assert manifest["command"][0] == "srun" and "--rdzv-endpoint=127.0.0.1:" in " ".join(manifest["command"])
    assert {rk["node"] for rk in manifest["ranks"].values()} == {"0", "1"}, "one rank on each node"
    assert summary["completion"]["all_completed"] and summary["completion"]["distinct_devices"]
    assert (run / layout.SLURM_LOG.replace("%j", job["job_id"])).is_file()


def test_a_sweep_submits_separate_jobs(slurm, out_root):
    r = ddp_run(["-m", *SMOKE, "launcher.nodes=1", "launcher.wait=false", "train.max_steps=2", "seed=1,2"],
                out_root, env=slurm)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = run_dirs(out_root)
    assert len(runs) == 2
    ids = {load_json(run / layout.SLURM_JOB)["job_id"] for run in runs}
    assert len(ids) == 2, "one Slurm job per sweep job"
    assert f"follow the sweep with: ddp-runs {runs[0].parent}" in r.stdout, r.stdout
    for run in runs:
        wait_for(f"{run.name} to complete", lambda run=run: _json(run / "summary.json").get("status") == "completed")
    sweep = load_json(runs[0].parent / "sweep.json")
    assert len(sweep["jobs"]) == 2 and {j["status"] for j in sweep["jobs"]} <= {"queued", "running", "completed"}


def test_a_six_job_sweep_is_submitted_at_once_then_followed_together(slurm, out_root):
    # Six jobs submitted before any is followed (the cluster runs four at once), one more refused by the plan.
    port = rdzv_base()
    r = ddp_run(["-m", "task=smoke", "device=cpu", "world_size=1", "launcher=slurm", "launcher.nodes=1",
                 f"launcher.rdzv_port={port}", "timeout_s=60", "train.max_steps=1", "checkpoint.final=false",
                 "seed=1,2,3,4,5,6,-1"], out_root, env=slurm, timeout=600)
    assert r.returncode == 2, r.stdout + r.stderr  # the worst job's exit code: the refused one's
    [sweep] = list(out_root.glob("*/*_sweep"))
    jobs = load_json(sweep / "sweep.json")["jobs"]
    assert [j["status"] for j in jobs] == ["completed"] * 6 + ["refused"], jobs
    assert jobs[6]["reason"].startswith("refused: seed=-1") and "slurm_job" not in jobs[6]
    submitted = jobs[:6]
    assert len({j["slurm_job"] for j in submitted}) == 6, "one Slurm job per sweep job"
    # All six submitted before the sweep follows any: the console's order, which load cannot change (a one-step job
    # may well end in Slurm before the sixth is submitted on a busy machine; the sweep only learns of it later).
    said = [m.start() for m in re.finditer(r"ddp-run: submitted Slurm job \d+", r.stdout)]
    followed = min((m.start() for m in re.finditer(r"ddp-run: (sweep: )?job \d+ ", r.stdout)), default=-1)
    assert len(said) == 6 and 0 <= max(said) < followed, "every job submitted before the sweep followed any"
    assert all(j["submitted"] < j["ended"] for j in submitted)
    out = r.stdout
    assert out.rindex("submitted Slurm job") < out.index("ddp-run: sweep: job "), "followed only after submitting"
    assert "ddp-run: sweep: 6 of 7 jobs completed" in out


def test_scancel_mid_run_ends_every_rank_and_leaves_a_truthful_run_dir(slurm, out_root):
    driver = subprocess.Popen([sys.executable, "-m", "ddp_runner", *SMOKE, "train.max_steps=1000000",
                               "train.log_every=1000", f"output.root={out_root}"], cwd=tempfile.gettempdir(),
                              env={**os.environ, **slurm}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("both ranks to train", lambda: len(list(out_root.rglob("logs/rank*.json"))) == 2)
        [run] = run_dirs(out_root)
        job_id = load_json(run / layout.SLURM_JOB)["job_id"]
        assert len(_procs_of(run)) >= 4, "the job's driver, two agents and two workers"
        subprocess.run(["scancel", job_id], env={**os.environ, **slurm}, check=True, timeout=60)
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode != 0, out + err
    assert f"Slurm job {job_id} CANCELLED" in out, out
    manifest = load_json(run / "run.json")
    assert manifest["status"] == "interrupted", manifest["status"]
    assert load_json(run / "summary.json")["status"] == "interrupted"
    wait_for("every rank to end", lambda: _procs_of(run) == [], timeout=30)


def test_ctrl_c_while_waiting_cancels_the_job(slurm, out_root):
    driver = subprocess.Popen([sys.executable, "-m", "ddp_runner", *SMOKE, "launcher.nodes=1",
                               "train.max_steps=1000000",
                               "train.log_every=1000", f"output.root={out_root}"], cwd=tempfile.gettempdir(),
                              env={**os.environ, **slurm}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("both ranks to train", lambda: len(list(out_root.rglob("logs/rank*.json"))) == 2)
        [run] = run_dirs(out_root)
        driver.send_signal(signal.SIGINT)
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 128 + signal.SIGINT, out + err
    assert "cancelling Slurm job" in err
    assert load_json(run / "run.json")["status"] == "interrupted"
    wait_for("every rank to end", lambda: _procs_of(run) == [], timeout=30)


def _start_requeued_now(job_id: str, env: dict[str, str]) -> None:
    """Lift the hold Slurm puts on a requeued job (two minutes: EligibleTime), which a test need not wait for.
    Not in the second of the requeue: slurmd revoked the old attempt's credential then, and refuses ("Job
    credential revoked", the job FAILED) a new one stamped in the same second on the same node."""
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env, check=True, timeout=60)


def _requeued_job_completes(run: Path, job_id: str, env: dict[str, str]) -> dict[str, Any]:
    """The requeued job's summary once it completed: a whole job again (allocation, start-up), minutes when the
    machine is busy. On a time-out, what Slurm says of the job and the run's status, to tell a slow cluster
    from a job that failed or never started."""
    try:
        return wait_for("the requeued job to complete",
                        lambda: (s := _json(run / "summary.json")).get("status") == "completed" and s, timeout=600)
    except AssertionError as exc:
        job = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True,
                             timeout=60).stdout
        raise AssertionError(f"{exc}; run.json status {_json(run / 'run.json').get('status')!r}; Slurm: {job}"
                             ) from None


def test_a_requeued_job_resumes_from_its_checkpoint(slurm, out_root):
    # Rank 0 hangs after step 5 on the first attempt only: step_4 is committed, then the job is requeued.
    args = [*SMOKE, "launcher.wait=false", "train.max_steps=8", "checkpoint.every_steps=2",
            "checkpoint.async_save=false", "fault.kind=hang", "fault.rank=0", "fault.step=5"]
    r = ddp_run(args, out_root, env=slurm)
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(out_root)
    job_id = load_json(run / layout.SLURM_JOB)["job_id"]
    assert f"submitted Slurm job {job_id}" in r.stdout and "not waiting" in r.stdout
    wait_for("checkpoint step_4", lambda: (run / "checkpoints" / "step_4" / "meta.json").exists())
    env = {**os.environ, **slurm}
    subprocess.run(["scontrol", "requeue", job_id], env=env, check=True, timeout=60)
    # Slurm holds a requeued job for two minutes (EligibleTime); a test need not wait for that.
    wait_for("the job to be requeued", lambda: "JobState=PENDING" in subprocess.run(
        ["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True, timeout=60).stdout)
    _start_requeued_now(job_id, env)
    summary = _requeued_job_completes(run, job_id, env)
    assert summary["steps"] == 8
    manifest = load_json(run / "run.json")
    assert manifest["slurm"]["restarts"] >= 1 and len(manifest["continued"]) >= 1
    assert "resumed from" in (run / layout.rank_log(0)).read_text()
    assert run_dirs(out_root) == [run], "the same run directory"


def test_the_warning_signal_saves_and_the_job_requeues_itself(slurm, out_root):
    # What Slurm sends before a time limit or a preemption (sbatch --signal=B:USR2@<s>), sent now: the ranks agree at
    # the next step, save, the run ends preempted, the job requeues itself and continues the same run directory.
    port = rdzv_base()
    args = [*SMOKE, "launcher.nodes=1", "launcher.wait=false", "train.max_steps=30", *rank0_sleeps(0.3),
            f"launcher.rdzv_port={port}"]
    r = ddp_run(args, out_root, env=slurm)
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(out_root)
    job_id = load_json(run / layout.SLURM_JOB)["job_id"]
    assert "#SBATCH --signal=B:USR2@120" in (run / layout.SLURM_SCRIPT).read_text()
    env = {**os.environ, **slurm}
    wait_for("step 3", lambda: _json(run / layout.rank_progress(0)).get("step", 0) >= 3)
    subprocess.run(["scancel", "--signal=USR2", "--batch", job_id], env=env, check=True, timeout=60)
    wait_for("the job to requeue itself", lambda: "JobState=PENDING" in subprocess.run(
        ["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True, timeout=60).stdout)
    manifest = load_json(run / "run.json")
    assert manifest["status"] == "preempted", manifest["status"]
    stopped = load_json(run / layout.rank_facts(0))["stopped"]
    assert (run / "checkpoints" / stopped["checkpoint"] / "meta.json").exists() and stopped["step"] < 30
    _start_requeued_now(job_id, env)
    summary = _requeued_job_completes(run, job_id, env)
    assert summary["steps"] == 30 and summary["resumed_from"].endswith(stopped["checkpoint"])
    assert len(summary["losses"]) == 30 and run_dirs(out_root) == [run]
