"""The concurrent sweep's pool (runner/job/pool.py) with stand-in jobs: tiny Python children that report what they
were given, in place of ddp-run. GPUs are four fake ones (no nvidia-smi topology: sets are taken in order), so the
GPU placement is checked on a CPU host; the view is drawn on a fake terminal."""

from __future__ import annotations

import io
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from ddp_runner.config.plan import Gpu
from ddp_runner.console.sweep_view import View
from ddp_runner.job.pool import Pool
from tests.support.driver import cli_in_process
from tests.support.waiting import wait_for

# A stand-in job: reports its devices as its outcome, after `hold` seconds (or at once on SIGINT, saying so, and
# whether its hold had run out by then). Its console records come after its SIGINT handler: a test that sees them
# knows the handler is in place.
CHILD = r"""
import json, os, signal, sys, time
job = json.loads(os.environ["DDP_RUNNER_SWEEP_JOB"])
got = {"code": 0, "run_dir": None, "refused": False, "reason": None, "stopped": None,
       "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "omp": os.environ.get("OMP_NUM_THREADS"),
       "affinity": sorted(os.sched_getaffinity(0)), "console": os.environ.get("DDP_RUNNER_SWEEP_CONSOLE")}
def stop(signum, frame):
    got["stopped"] = signum
signal.signal(signal.SIGINT, stop)
with open(got["console"], "w") as f:
    f.write(json.dumps({"kind": "start", "total": 10, "start": 0}) + "\n")
    f.write(json.dumps({"kind": "step", "step": 3, "total": 10, "loss": 0.5, "rate": 100.0}) + "\n")
deadline = time.time() + float(sys.argv[1])
while time.time() < deadline and got["stopped"] is None:
    time.sleep(0.05)
got["held_out"] = time.time() >= deadline
with open(job["result"], "w") as f:
    json.dump(got, f)
"""

GPUS = [Gpu(i, "fake", f"GPU-{i}{i}{i}") for i in range(4)]


@pytest.fixture(autouse=True)
def _no_leftovers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pool of these tests removes its private folder at the end (as a sweep does)."""
    made: list[Pool] = []
    real = Pool.__init__

    def init(self: Pool, *args, **kwargs) -> None:
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(Pool, "__init__", init)
    yield
    for pool in made:
        for child in pool.running.values():  # a failed check leaves a held job running: end it
            child.proc.kill()
            child.proc.wait()
        pool.close()


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _argv(hold: float) -> list[str]:
    return [sys.executable, "-c", CHILD, str(hold)]


def test_gpu_jobs_get_disjoint_sets_their_uuids_and_wait_for_free_gpus(tmp_path: Path) -> None:
    ended = []
    pool = Pool("auto", on_end=ended.append, gpus=lambda: GPUS, view=View(io.StringIO()))
    conf = {"device": "cuda", "world_size": 2, "launcher": {"nnodes": 1}, "sweep": {}}
    try:
        # The first job holds its GPUs until this test stops it: only the second one's can free up for the third.
        first = pool.start(0, {"seed": "1"}, _argv(3600), conf, str(tmp_path))
        second = pool.start(1, {"seed": "2"}, _argv(0.2), conf, str(tmp_path))
        third = pool.start(2, {"seed": "3"}, _argv(0.0), conf, str(tmp_path))  # waits for two free GPUs
        # The pool's own records, not the clock: the third job started after the second one's end was reaped.
        assert 1 in pool.done and third and third.started >= pool.done[1].ended, \
            "the third job started only once one had ended"
        wait_for("the first job's handler", lambda: '"step"' in _read(first.files["console"]))
        first.proc.send_signal(signal.SIGINT)
        pool.wait_all()
    finally:
        pool.wait_all()
    assert first and second and third
    assert first.ids == [0, 1] and second.ids == [2, 3] and third.ids == [2, 3]
    outcomes = {c.num: c.outcome for c in ended}
    assert outcomes[0]["cvd"] == "GPU-000,GPU-111" and outcomes[1]["cvd"] == "GPU-222,GPU-333"
    assert first.placement()["gpus"] == [0, 1] and first.placement()["peer_connected"] is None  # no topology
    assert first.placement()["started"] < first.placement()["ended"]


def test_cpu_jobs_are_pinned_to_their_own_cores_and_threads(tmp_path: Path) -> None:
    ended = []
    pool = Pool(2, on_end=ended.append, cores=[0, 1], view=View(io.StringIO()))
    conf = {"device": "cpu", "world_size": 1, "launcher": {"nnodes": 1}, "sweep": {"cores_per_rank": 1}}
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores to pin two jobs")
    pool.cores = cores[:2]
    a = pool.start(0, {}, _argv(0.5), conf, str(tmp_path))
    b = pool.start(1, {}, _argv(0.5), conf, str(tmp_path))
    pool.wait_all()
    assert a and b and a.ids != b.ids
    for child in (a, b):
        assert child.outcome["affinity"] == child.ids and child.outcome["omp"] == "1"
        assert child.outcome["cvd"] == os.environ.get("CUDA_VISIBLE_DEVICES")


def test_a_stop_reaches_every_running_job_once_and_later_jobs_do_not_start(tmp_path: Path) -> None:
    out = io.StringIO()
    pool = Pool("auto", on_end=lambda c: None, cores=[0, 1], view=View(out))
    conf = {"device": "cpu", "world_size": 1, "launcher": {"nnodes": 1}, "sweep": {}}
    # Held far longer than any test may run: only the stop can end them.
    running = [pool.start(n, {}, _argv(3600), conf, str(tmp_path)) for n in range(2)]
    for c in running:  # each child's console records come after its SIGINT handler is in place
        wait_for(f"job {c.num}'s handler", lambda c=c: '"step"' in _read(c.files["console"]))
    pool._on_signal(signal.SIGINT, None)
    assert pool.start(2, {}, _argv(0), conf, str(tmp_path)) is None, "no job starts once the sweep stops"
    pool.wait_all()
    assert [c.outcome["held_out"] for c in running] == [False, False], "the stop ended them, not their hold"
    assert [c.outcome["stopped"] for c in running] == [signal.SIGINT, signal.SIGINT]
    assert "stopping 2 running jobs: each saves a checkpoint" in out.getvalue()


def test_the_view_draws_every_running_job_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    term = Terminal()
    view = View(term)
    pool = Pool("auto", on_end=lambda c: None, cores=[0, 1], view=view)
    conf = {"device": "cpu", "world_size": 1, "launcher": {"nnodes": 1}, "sweep": {}}
    child = pool.start(0, {"train.lr": "0.1"}, _argv(1.0), conf, str(tmp_path))
    records = view.records[0]  # kept here: the view lets go of it when the job ends
    # The pool draws while the job runs, until the job's step record is read (the job may end meanwhile).
    wait_for("job 0's step record", lambda: pool.poll() or records.read()["step"] == 3)
    state = records.read()
    assert state["step"] == 3 and state["loss"] == 0.5 and state["total"] == 10
    pool.wait_all()
    text = term.getvalue()
    assert child is not None and "job 0 (lr=0.1) started on core" in text and "ended: completed" in text


def test_a_concurrent_sweep_on_several_hosts_is_refused_naming_the_key(tmp_path: Path, monkeypatch) -> None:
    r = cli_in_process(["-m", "task=smoke", "launcher=multinode", "launcher.rdzv_endpoint=127.0.0.1:29400",
                        "launcher.rdzv_id=x", "world_size=2", "sweep.parallel=auto", "seed=1,2", "dry_run=true"],
                       tmp_path / "out", monkeypatch)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "refused: sweep.parallel='auto'" in r.stderr and "launcher=multinode" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_concurrent_job_gets_the_options_as_typed_and_its_own_overrides(tmp_path: Path, monkeypatch) -> None:
    """``--config-dir`` is rewritten for Hydra (the user's folder first); a job's own ddp-run gets it as typed and
    redoes that itself."""
    from ddp_runner import cli

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text("defaults:\n  - _self_\n")
    monkeypatch.setattr(cli, "_run", cli._Invocation())
    args = ["-m", "-cd", str(tmp_path / "conf"), "seed=1,2", "sweep.parallel=auto"]
    _, hydra_args, config_path = cli._hydra_args(args)
    assert config_path != cli.CONFIG_PATH and "-cd" not in hydra_args, "Hydra gets the rewritten form"
    assert cli._run.jobs_of is not None and cli._run.jobs_of.config_flags == ["-cd", str(tmp_path / "conf")]
    shutil.rmtree(cli._run.jobs_of.record.hydra_dir, ignore_errors=True)


def test_a_dry_run_sweep_with_a_refused_job_still_exits_2(tmp_path: Path, monkeypatch) -> None:
    r = cli_in_process(["-m", "task=smoke", "device=cpu", "world_size=1", "train.lr=0.1,-1", "sweep.parallel=auto",
                        "dry_run=true"], tmp_path / "out", monkeypatch)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.count("dry run, nothing launched") == 1 and "refused: train.lr=-1" in r.stderr
    assert not (tmp_path / "out").exists()
