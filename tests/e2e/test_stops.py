"""A checkpoint on every stop, end to end (real torchrun, gloo ranks): SIGINT to the driver or SIGTERM to a worker
at a random step, with the default checkpoint settings, leaves a checkpoint at that step or the next; the run ends
``interrupted`` and names the command that continues it; the resume gives the uninterrupted run's per-step losses
and final parameters exactly, and TensorBoard one point per step.

The signal is sent once the driver's console has printed step k (rank 0 prints each step as it ends); the rank it
reaches records after which step it came (k or later on a loaded machine), and the ranks agree at that step's
boundary or the next. A slow rank (``fault.kind=slow``, not repeated by the resume) leaves
time to send it mid-run.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from ddp_runner.tasks.engine import checkpoint as ck
from tests.support.driver import ddp_run
from tests.support.recipes import GPT_DROPOUT_STEPS, gpt_dropout_args, gpt_fsdp_args, rank0_sleeps
from tests.support.run_tree import copy_run, load_json, run_dirs
from tests.support.shared_runs import shared_run
from tests.support.waiting import wait_for

DEFAULT_CKPT = {"checkpoint.every_steps": "0", "checkpoint.keep_last": "2", "checkpoint.async_save": "true"}
SLOW = rank0_sleeps(0.4)
STOP_BOUND_S = 10.0  # half the driver's grace (checkpoint.stop_grace_s: 20 s)


def with_default_checkpoints(args: list[str]) -> list[str]:
    """``args`` with the checkpoint settings a new user has (one checkpoint at the end, background saves)."""
    return [a for a in args if a.split("=", 1)[0] not in DEFAULT_CKPT] + [f"{k}={v}" for k, v in DEFAULT_CKPT.items()]


def stop_mid_run(args: list[str], root: Path, at_step: int, how: str) -> tuple[int, str, str]:
    """Launch, and once step ``at_step`` is printed send SIGINT to the driver (``how="driver"``) or SIGTERM to
    rank 1 (``how="worker"``); returns the exit code, stdout and stderr. The driver has ended within
    ``STOP_BOUND_S`` of the signal."""
    env = {**os.environ}
    proc = subprocess.Popen([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"],
                            cwd=tempfile.gettempdir(),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if re.match(rf"\s*step {at_step}/", line):
            break
    else:
        pytest.fail(f"the run ended before step {at_step}:\n{''.join(seen)}\n{proc.stderr.read()}")
    t0 = time.monotonic()
    if how == "driver":
        proc.send_signal(signal.SIGINT)
    else:
        [run] = run_dirs(root)
        pid = wait_for("rank 1's facts", lambda: load_json(run / "logs/rank1.json").get("pid"))
        os.kill(pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    # The ranks stop at the next step boundary (0.4 s each here) and save; the rest is the driver's own work.
    # torchrun waited 30 s for ranks that had saved while it shut down (tasks/forked.py).
    elapsed = time.monotonic() - t0
    assert elapsed < STOP_BOUND_S, f"the driver ended {elapsed:.1f} s after the signal\n{err}"
    return proc.returncode, "".join(seen) + out, err


def final_model(run: Path) -> dict[str, torch.Tensor]:
    step = run / f"checkpoints/step_{GPT_DROPOUT_STEPS}"
    if (step / "model.pt").exists():  # sharded (fsdp): the last checkpoint's consolidated model
        return torch.load(step / "model.pt", weights_only=True)
    return ck.load(str(step))["model"]


def tb_points(run: Path, tag: str) -> list[int]:
    """The steps TensorBoard shows for ``tag`` (its reader applies the purge a resume writes)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def check_stopped(code: int, out: str, err: str, root: Path, at_step: int, signum: int,
                  copy: Path | None = None) -> Path:
    """The stopped run: its status, the checkpoint at ``at_step`` or the next, and the command that continues.
    ``copy``: a copy of the run directory made as the stopped launch ended, read instead of the run (which a later
    launch has continued since)."""
    [run] = run_dirs(root)
    files = copy or run
    assert code == 128 + signum, out + err
    manifest, summary = load_json(files / "run.json"), load_json(files / "summary.json")
    assert manifest["status"] == "interrupted" and summary["status"] == "interrupted", err
    stopped = load_json(files / "logs/rank0.json")["stopped"]
    # The signal was sent once step ``at_step`` was printed; on a loaded machine it can arrive steps later. Each
    # rank it reached (rank 1 for a worker's SIGTERM; every rank through torchrun for the driver's SIGINT) says
    # after which step it came; the ranks stop at the boundary of the earliest of those steps, or the next.
    other = load_json(files / "logs/rank1.json")["stopped"]
    assert other["step"] == stopped["step"], (stopped, other)  # every rank stopped at the same step
    arrived = min(s["signal_after_step"] for s in (stopped, other) if s["signal_after_step"] is not None)
    assert arrived >= at_step and stopped["step"] in (arrived, arrived + 1), (at_step, stopped, other)
    latest = ck.latest(f"{files}/checkpoints")
    assert latest is not None and latest.endswith(f"step_{stopped['step']}"), (latest, stopped)
    assert summary["root_cause"] is None and len(summary["losses"]) == stopped["step"]
    assert f"ddp-run resume={run}" in err, err
    return run


def check_resumed_exactly(run: Path, reference: Path, out: str) -> None:
    summary = load_json(run / "summary.json")
    assert summary["status"] == "completed" and summary["steps"] == GPT_DROPOUT_STEPS
    assert summary["losses"] == load_json(reference / "summary.json")["losses"]
    a, b = final_model(run), final_model(reference)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert re.search(rf"resumed from step \d+ of {re.escape(str(run))}", out), out
    assert tb_points(run, "train/loss") == list(range(1, GPT_DROPOUT_STEPS + 1)), "one point per step"


def test_sigint_to_the_driver_saves_and_the_resume_is_exact(tmp_path, text_file, gpt_dropout_reference):
    """With a DataLoader worker per rank too, as on GPUs: torchrun signals each rank's whole process group."""
    at = random.randint(3, 11)
    args = [*with_default_checkpoints(gpt_dropout_args(text_file)), "train.num_workers=1"]
    code, out, err = stop_mid_run([*args, *SLOW], tmp_path / "out", at, "driver")
    run = check_stopped(code, out, err, tmp_path / "out", at, signal.SIGINT)
    r = ddp_run([f"resume={run}"], tmp_path / "unused")
    assert r.returncode == 0, r.stdout + r.stderr
    check_resumed_exactly(run, gpt_dropout_reference, r.stdout + r.stderr)


@pytest.fixture(scope="session")
def sigterm_then_final_validation(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> dict:
    """One run of :func:`gpt_dropout_args` with the default checkpoint settings, three launches (made once per
    session, shared by xdist workers; test_sigterm_to_a_worker_… and test_a_stop_during_the_final_validation_… read
    it, one launch is both tests'):

    - ``a``: data.path given relative (to the launch's directory), rank 0 slowed (SLOW); SIGTERM to rank 1 once
      step ``at`` (random) is printed. ``stage_a``: a copy of the run directory as it ended.
    - ``b``: ``resume=last`` from another directory continues it; rank 0 sends SIGINT to the driver as the final
      validation begins and waits until the stop reaches it (faults.in_phase). ``stage_b``: a copy as it ended;
      ``latest``, ``committed``: the run's newest checkpoint then and its commit marker's mtime.
    - ``c``: ``resume=<run dir>``.

    Each launch's ``rc``, ``stdout`` and ``stderr`` are in the record (``stop_mid_run``'s time bound holds for
    ``a``)."""
    from ddp_runner.tasks.engine.diagnostics import faults

    def make(root: Path) -> Path:
        base = root.parent
        at = random.randint(3, 11)
        relative = os.path.relpath(text_file, tempfile.gettempdir())
        args = [a if not a.startswith("data.path=") else f"data.path={relative}"
                for a in with_default_checkpoints(gpt_dropout_args(text_file))]
        code, out, err = stop_mid_run([*args, *SLOW], root, at, "worker")
        [run] = run_dirs(root)
        record = {"run": str(run), "at": at, "relative": relative, "a": {"rc": code, "stdout": out, "stderr": err},
                  "stage_a": str(copy_run(run, base / "stage-a"))}
        elsewhere = base / "elsewhere"
        elsewhere.mkdir()
        b = subprocess.run([sys.executable, "-m", "ddp_runner", "resume=last", f"output.root={root}"], cwd=elsewhere,
                           env={**os.environ, faults.ENV_STOP_AT: f"validation@{GPT_DROPOUT_STEPS}"},
                           capture_output=True, text=True, timeout=240)
        record["b"] = {"rc": b.returncode, "stdout": b.stdout, "stderr": b.stderr}
        record["stage_b"] = str(copy_run(run, base / "stage-b"))
        latest = ck.latest(f"{run}/checkpoints")
        record["latest"] = latest
        record["committed"] = (Path(latest) / "meta.json").stat().st_mtime_ns if latest else None
        c = ddp_run([f"resume={run}"], base / "unused")
        record["c"] = {"rc": c.returncode, "stdout": c.stdout, "stderr": c.stderr}
        (base / "record.json").write_text(json.dumps(record))
        return run

    run = shared_run(tmp_path_factory, "stops-sigterm-then-final-validation", make)
    return load_json(run.parents[2] / "record.json")


def test_sigterm_to_a_worker_saves_and_resume_last_continues_it(text_file, gpt_dropout_reference,
                                                                sigterm_then_final_validation):
    """Also: data.path given relative (to the launch's directory) is recorded absolute, its spelling kept, and
    resume=last continues the run from another directory. (That continuation is stopped again as its final
    validation begins, every step trained: test_a_stop_during_the_final_validation_…; the launch after it runs
    only that validation.)"""
    chain = sigterm_then_final_validation
    run, a, b, c = Path(chain["run"]), chain["a"], chain["b"], chain["c"]
    stage_a = Path(chain["stage_a"])
    assert check_stopped(a["rc"], a["stdout"], a["stderr"], run.parents[1], chain["at"], signal.SIGTERM,
                         copy=stage_a) == run
    assert f"path: {text_file}" in (stage_a / "config.yaml").read_text()
    assert load_json(stage_a / "run.json")["invocation"]["paths_given"] == {"data.path": chain["relative"]}
    assert b["rc"] == 128 + signal.SIGINT and c["rc"] == 0, b["stdout"] + b["stderr"] + c["stdout"] + c["stderr"]
    assert f"resume=last: continuing {run}" in b["stdout"]
    check_resumed_exactly(run, gpt_dropout_reference, b["stdout"] + b["stderr"])


def test_a_completed_run_trains_longer_when_max_steps_is_raised(tmp_path, smoke_reference):
    """The fix the refusal names: a completed run continues from its final checkpoint, its record whole."""
    import shutil

    run = tmp_path / "root" / "2026-01-01" / smoke_reference.name
    shutil.copytree(smoke_reference, run)
    r = ddp_run([f"resume={run}", "train.max_steps=10"], tmp_path / "unused")
    assert r.returncode == 0, r.stdout + r.stderr
    summary, reference = load_json(run / "summary.json"), load_json(smoke_reference / "summary.json")
    assert summary["steps"] == 10 and summary["resumed_from"].endswith("step_8")
    assert summary["losses"][:8] == reference["losses"] and len(summary["losses"]) == 10
    assert tb_points(run, "train/loss") == list(range(1, 11))


def test_sigint_under_fsdp_saves_every_shard_and_the_resume_is_exact(tmp_path, text_file, gpt_fsdp_reference):
    """In bf16 with dropout: the e2e conftest's gpt_fsdp_reference, which test_strategies.py's SIGKILL under fsdp
    resumes to as well."""
    at = random.randint(3, 11)
    code, out, err = stop_mid_run([*with_default_checkpoints(gpt_fsdp_args(text_file)), *SLOW], tmp_path / "out", at,
                                  "driver")
    run = check_stopped(code, out, err, tmp_path / "out", at, signal.SIGINT)
    shards = Path(ck.latest(f"{run}/checkpoints")) / "shards"
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    r = ddp_run([f"resume={run}"], tmp_path / "unused")
    assert r.returncode == 0, r.stdout + r.stderr
    check_resumed_exactly(run, gpt_fsdp_reference, r.stdout + r.stderr)


def test_a_stop_during_the_final_validation_keeps_every_step_and_the_resume_validates(sigterm_then_final_validation):
    """SIGINT to the driver during the end validation (rank 0 sends it as that validation begins and waits until the
    stop reaches it: faults.in_phase), here in the launch that continues the run test_sigterm_to_a_worker_… stopped:
    the final checkpoint holds every step, the run ends interrupted after its last step, and ``resume=<run dir>``
    runs only the final validation (docs/resume.md)."""
    chain = sigterm_then_final_validation
    last = GPT_DROPOUT_STEPS
    run, r, again, stage_b = Path(chain["run"]), chain["b"], chain["c"], Path(chain["stage_b"])
    assert r["rc"] == 128 + signal.SIGINT, r["stdout"] + r["stderr"]
    manifest, summary = load_json(stage_b / "run.json"), load_json(stage_b / "summary.json")
    assert manifest["status"] == summary["status"] == "interrupted", r["stderr"]
    latest = chain["latest"]
    assert latest is not None and latest.endswith(f"step_{last}"), f"the final checkpoint: no step lost\n{r['stderr']}"
    assert ck.latest(f"{stage_b}/checkpoints").endswith(f"step_{last}")
    stopped = load_json(stage_b / "logs/rank0.json").get("stopped") or {}
    assert stopped.get("step") == last and stopped["last_step"] and stopped["during"] == "the final validation", stopped
    assert summary["steps"] == last and len(summary["losses"]) == last and summary["val_loss"] is None
    assert f"every rank stopped after step {last}, the last, during the final validation" in r["stderr"], r["stderr"]
    assert f"ddp-run resume={run}" in r["stderr"] and "no checkpoint was committed" not in r["stderr"]

    committed = chain["committed"]
    assert again["rc"] == 0, again["stdout"] + again["stderr"]
    resumed = load_json(run / "summary.json")
    assert resumed["status"] == "completed" and resumed["steps"] == last and resumed["val_loss"] is not None
    assert resumed["losses"] == summary["losses"] and resumed["resumed_from"].endswith(f"step_{last}")
    assert not re.search(rf"^\s*step \d+/{last} .*loss [\d.]+ ", again["stdout"], re.M), "no step trained again"
    assert tb_points(run, "val/loss") == [last] and tb_points(run, "train/loss") == list(range(1, last + 1))
    assert (Path(latest) / "meta.json").stat().st_mtime_ns == committed, "the final checkpoint stands as it was"


def _handles(pid: int, signum: int) -> bool:
    """Has process ``pid`` a handler of its own for ``signum`` (Linux: SigCgt in /proc/<pid>/status)?"""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(caught >> (signum - 1) & 1)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads a process's handlers in /proc (Linux)")
def test_a_driver_started_in_the_background_takes_a_stop_from_its_first_moments(tmp_path):
    """A background job of a non-interactive shell starts with SIGINT ignored (POSIX), as here: the driver installs
    its own handler first thing, before Hydra is imported, and a SIGINT as soon as it is there (the process's own
    record of its handlers says so) ends the driver with one line and exit 130, before any run directory exists."""
    root = tmp_path / "out"
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what the shell does before it starts the job
    try:
        proc = subprocess.Popen([sys.executable, "-m", "ddp_runner", "task=smoke", "device=cpu", "world_size=1",
                                 f"output.root={root}"], cwd=tempfile.gettempdir(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, ignored)
    wait_for("the driver's SIGINT handler", lambda: _handles(proc.pid, signal.SIGINT), interval=0.002, driver=proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, out + err
    said = [line for line in err.splitlines() if "SIGINT" in line]
    assert "Traceback" not in err and len(said) == 1, err
    assert said[0].startswith("ddp-run: stopped by SIGINT before launching: nothing was started"), err
    assert not run_dirs(root) and not [p for p in root.rglob("*") if p.is_file()], "no run directory"
