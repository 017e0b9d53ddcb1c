"""Chaos: short real runs (smoke task, 2 gloo ranks, real torchrun) where a random rank, the driver or the storage
fails at a random moment (seeded: ``CHAOS_SEED``). After each, the run directory either resumes to per-step losses
bit-identical to an uninterrupted run, or its run.json says truthfully why not; and no process is left behind.
The kinds strike one launch each, each next one the launch that continues the run the one before left.

Also a remote run whose object store goes away mid-run (a private moto server, stopped): the driver ends with one
line and a non-zero exit, no traceback, and no process left.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from ddp_runner.contract import layout
from ddp_runner.rundir.status import status_of
from tests.support.driver import ddp_run
from tests.support.ports import free_port
from tests.support.run_tree import load_json, run_dirs
from tests.support.s3_server import _wait_until_up
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("CHAOS_SEED", "16"))
STEPS = 40
# 64 samples / 2 ranks / 8 per rank = 4 steps per epoch; a checkpoint every 4 steps, the default async save.
ARGS = ["task=smoke", "device=cpu", "world_size=2", f"train.max_steps={STEPS}", "checkpoint.every_steps=4",
        "checkpoint.keep_last=2", "train.log_every=1", "seed=5"]
KINDS = ("rank", "driver_kill", "driver_term", "storage")


def _start(root: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ddp_runner", *ARGS, f"output.root={root}"],
                            cwd=tempfile.gettempdir(), env={**os.environ, **(env or {})}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _rank_pid(procs: list[psutil.Process], rank: int) -> int | None:
    """Rank ``rank``: a fork of torchrun's server named ``ddp-rank<R>`` (its DataLoader workers, its own forks,
    carry the name too)."""
    for p in procs:
        try:
            if p.name() == f"ddp-rank{rank}" and psutil.Process(p.ppid()).name() != p.name():
                return p.pid
        except psutil.Error:
            continue
    return None


def _steps_done(pid: int, temp: Path) -> int:
    """The optimizer steps the rank ``pid`` has done, from its progress record in a remote run's local staging
    folder (``ddp-run-<run>-*`` in the driver's temporary folder ``temp``); 0 before it has one."""
    for path in temp.glob(f"ddp-run-*/{layout.rank_progress(0)}"):
        try:
            record = load_json(path)
        except (OSError, ValueError):  # being replaced, or another run's folder going away
            continue
        if record.get("pid") == pid:
            return int(record.get("step", 0))
    return 0


def _break_storage(run: Path) -> Callable[[], None]:
    """The checkpoint folder stops being usable (a file where the folder was: fails for root too); returns how
    to mend it, keeping the checkpoints written so far."""
    ckpts, aside = run / layout.CHECKPOINTS, run / "checkpoints.aside"
    ckpts.rename(aside)
    ckpts.write_text("not a folder")

    def mend() -> None:
        ckpts.unlink()
        aside.rename(ckpts)

    return mend


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[list[float], float]:
    """An uninterrupted run: its per-step losses and its wall-clock."""
    root = tmp_path_factory.mktemp("reference")
    t0 = time.monotonic()
    r = ddp_run(ARGS, root)
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(root)
    losses = load_json(run / layout.SUMMARY)["losses"]
    assert len(losses) == STEPS
    return losses, time.monotonic() - t0


def _launch(args: list[str], root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"],
                            cwd=tempfile.gettempdir(), env=os.environ, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _check_says_why_not(kind: str, st: str, code: int, err: str, run: Path) -> None:
    """A run that did not complete says truthfully why not."""
    expected = {"driver_kill": {"lost"}, "driver_term": {"interrupted"}}.get(kind, {"failed"})
    assert st in expected, (kind, st, err[-2000:])
    assert code != 0
    if st != "lost":
        summary = load_json(run / layout.SUMMARY)
        assert summary["status"] == st
        if st == "failed":
            assert summary["root_cause"], "a failure names its cause"
        else:  # a stop asked for (SIGTERM): no failure to blame once the ranks agreed on a stop (as
            # tests/e2e/test_stops.py); stopped earlier (before the ranks ran), the signal is named
            cause = summary["root_cause"]
            assert cause is None or (cause["class"] == "interrupted" and "signal 15" in cause["message"]), cause


def _check_completed_exactly(kind: str, run: Path, losses: list[float]) -> None:
    assert load_json(run / layout.MANIFEST)["status"] == layout.STATUS_COMPLETED
    assert load_json(run / layout.SUMMARY)["losses"] == losses, (kind, "per-step losses differ")
    assert not [p for p in run.rglob("*") if ".tmp" in p.name and p.is_file()], "temporary files left"


@pytest.mark.timeout(900)  # ~2 min on an idle 2-core machine; far more when it is shared
def test_every_run_directory_resumes_bit_identically_or_says_why_not(reference, tmp_path):
    """The kinds strike in a seeded order, one launch each: the first a fresh run, each next one the launch that
    continues the run directory the one before left (``resume=<run>``; or, when that run had no checkpoint yet, the
    refusal that asks for a decision and then its fix, ``resume=restart``). A continued run must survive them as a
    fresh one does. A launch that completes before its kind strikes, and the last one, are checked to the
    reference's per-step losses; a kind then strikes a fresh run."""
    losses, wall = reference
    rng = random.Random(SEED)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    report = []
    run: Path | None = None  # the run directory the next launch continues (None: a fresh run)

    def next_launch(i: int, kind: str) -> tuple[subprocess.Popen[str], Path]:
        """The launch that continues ``run`` (or a fresh one), once its driver has the run directory."""
        if run is None:
            root = tmp_path / f"{i}-{kind}"
            driver = _start(root)
            return driver, wait_for("the run directory", lambda r=root: (run_dirs(r) or [None])[0])
        if not list((run / "checkpoints").glob("step_*")):  # stopped before its first checkpoint
            r = ddp_run([f"resume={run}"], tmp_path / "unused")
            assert r.returncode == 2 and "resume=restart" in r.stderr, (kind, r.stdout + r.stderr)
            root = tmp_path / f"{i}-restart"
            driver = _launch([*ARGS, "resume=restart"], root)
            return driver, wait_for("the run directory", lambda r=root: (run_dirs(r) or [None])[0])
        driver = _launch([f"resume={run}"], tmp_path / "unused")
        # (it records itself in run.json once it has the run: a refused continuation fails here, with its output)
        wait_for("the driver to take the run directory",
                 lambda d=driver, r=run: (load_json(r / layout.MANIFEST).get("driver") or {}).get("pid") == d.pid,
                 driver=driver)
        return driver, run

    for i, kind in enumerate(kinds):
        driver, run = next_launch(i, kind)
        seen: list[psutil.Process] = []
        # A random moment between the run directory's creation and the end of an undisturbed run.
        moment_s = rng.uniform(0.0, wall * 0.6)  # (the reference's wall-clock includes start-up and the end)
        moment = time.monotonic() + moment_s
        while time.monotonic() < moment and driver.poll() is None:
            seen += [p for p in _tree(driver.pid) if p.pid not in {q.pid for q in seen}]
            time.sleep(0.05)
        mend = None
        if driver.poll() is None:
            if kind == "rank":  # (a moment before the ranks exist becomes the moment they do)
                rank = rng.randrange(2)
                pid = wait_for("a rank to kill",
                               lambda r=rank, d=driver: _rank_pid(_tree(d.pid), r) or d.poll() is not None)
                if pid is not True and driver.poll() is None:
                    os.kill(pid, signal.SIGKILL)
            elif kind == "driver_kill":
                driver.kill()
            elif kind == "driver_term":
                driver.terminate()
            else:
                mend = _break_storage(run)
        seen += _tree(driver.pid)
        out, err = driver.communicate(timeout=150)
        wait_for("every process of the run to end", lambda s=seen: not _alive(s), timeout=60)
        if mend:
            mend()

        manifest = load_json(run / layout.MANIFEST)
        st = status_of(manifest)
        report.append(f"{kind}: rc {driver.returncode}, {st}")
        print(f"chaos: {kind} after {moment_s:.1f} s: rc {driver.returncode}, {st}", flush=True)
        if st != layout.STATUS_COMPLETED:  # it says why not, and the next launch continues it
            _check_says_why_not(kind, st, driver.returncode, err, run)
        else:  # it completed before the kind struck: the very same losses; the next kind strikes a fresh run
            _check_completed_exactly(kind, run, losses)
            run = None
    if run is not None:  # ... and it resumes to the very same losses (a run stopped before its first checkpoint:
        # the refusal that asks for a decision, and its fix, a restart from step 0, gives them too)
        r = ddp_run([f"resume={run}"], tmp_path / "unused")
        if not list((run / "checkpoints").glob("step_*")):
            assert r.returncode == 2 and "resume=restart" in r.stderr, r.stdout + r.stderr
            r = ddp_run([*ARGS, "resume=restart"], tmp_path / "last-restart")
            [run] = run_dirs(tmp_path / "last-restart")
        assert r.returncode == 0, r.stdout + r.stderr
        _check_completed_exactly("last", run, losses)
    print(f"chaos (seed {SEED}): {'; '.join(report)}")


@pytest.mark.timeout(600)
def test_a_lost_object_store_ends_the_run_truthfully_with_no_process_left(tmp_path):
    # The driver's own temporary folder: its staging folder is found (and removed) there, never another test's
    # (runs started in the same second by other tests share the run's name).
    temp = tmp_path / "tmp"
    temp.mkdir()
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint, "FSSPEC_S3_ENDPOINT_URL": endpoint,
           "AWS_MAX_ATTEMPTS": "2", layout.ENV_HEARTBEAT_S: "0.5", "TMPDIR": str(temp)}
    try:
        _wait_until_up(server, endpoint)
        # The bucket, by S3's own CreateBucket (a PUT; moto asks no signature): not a python importing s3fs for it.
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/chaos", method="PUT"), timeout=60).close()
        driver = subprocess.Popen([sys.executable, "-m", "ddp_runner", *ARGS, "train.max_steps=400",
                                   "output.root=s3://chaos/out"], cwd=tempfile.gettempdir(),
                                  env={**os.environ, **env}, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        seen: list[psutil.Process] = []
        rank0 = wait_for("rank 0 to start", lambda: _rank_pid(_tree(driver.pid), 0))
        seen += _tree(driver.pid)
        # Training is under way (rank 0's own progress record in the driver's staging folder says a step is
        # done) before the store goes: a mid-run loss, however slowly this machine starts the ranks.
        wait_for("rank 0's first step", lambda: _steps_done(rank0, temp) >= 1, driver=driver)
        server.kill()  # the store is gone: checkpoints, the heartbeat, run.json all fail from here
        server.wait()
        seen += [p for p in _tree(driver.pid) if p.pid not in {q.pid for q in seen}]
        out, err = driver.communicate(timeout=240)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    wait_for("every process of the run to end", lambda: not _alive(seen), timeout=60)
    assert driver.returncode != 0, out + err
    assert "Traceback" not in err, err[-3000:]
    assert "ddp-run: FAILED" in err, err[-3000:]
    name = out.split("ddp-run: run directory ", 1)[1].split()[0].rsplit("/", 1)[-1]
    # What could not be mirrored stays on local disk, and the console says where.
    kept = list(temp.glob(f"ddp-run-{name}-*"))
    assert len(kept) == 1 and (kept[0] / layout.LOGS).is_dir(), kept
    assert "could not be copied into s3://chaos/out/" in err and f"they stay in {kept[0]}" in err, err[-3000:]
