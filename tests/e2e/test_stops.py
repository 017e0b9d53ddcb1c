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
from conftest import GPT_DROPOUT_STEPS, ddp_run, gpt_dropout_args, gpt_fsdp_args, load_json, run_dirs, wait_for

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ddp_runner.tasks.engine import checkpoint as ck  # noqa: E402

DEFAULT_CKPT = {"checkpoint.every_steps": "0", "checkpoint.keep_last": "2", "checkpoint.async_save": "true"}
SLOW = ["fault.kind=slow", "fault.rank=0", "fault.step=1", "fault.slow_s=0.4"]
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


def check_stopped(code: int, out: str, err: str, root: Path, at_step: int, signum: int) -> Path:
    """The stopped run: its status, the checkpoint at ``at_step`` or the next, and the command that continues."""
    [run] = run_dirs(root)
    assert code == 128 + signum, out + err
    manifest, summary = load_json(run / "run.json"), load_json(run / "summary.json")
    assert manifest["status"] == "interrupted" and summary["status"] == "interrupted", err
    stopped = load_json(run / "logs/rank0.json")["stopped"]
    # The signal was sent once step ``at_step`` was printed; on a loaded machine it can arrive steps later. Each
    # rank it reached (rank 1 for a worker's SIGTERM; every rank through torchrun for the driver's SIGINT) says
    # after which step it came; the ranks stop at the boundary of the earliest of those steps, or the next.
    other = load_json(run / "logs/rank1.json")["stopped"]
    assert other["step"] == stopped["step"], (stopped, other)  # every rank stopped at the same step
    arrived = min(s["signal_after_step"] for s in (stopped, other) if s["signal_after_step"] is not None)
    assert arrived >= at_step and stopped["step"] in (arrived, arrived + 1), (at_step, stopped, other)
    latest = ck.latest(f"{run}/checkpoints")
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


def test_sigterm_to_a_worker_saves_and_resume_last_continues_it(tmp_path, text_file, gpt_dropout_reference):
    """Also: data.path given relative (to the launch's directory) is recorded absolute, its spelling kept, and
    resume=last continues the run from another directory."""
    at = random.randint(3, 11)
    relative = os.path.relpath(text_file, tempfile.gettempdir())
    args = [a if not a.startswith("data.path=") else f"data.path={relative}"
            for a in with_default_checkpoints(gpt_dropout_args(text_file))]
    code, out, err = stop_mid_run([*args, *SLOW], tmp_path / "out", at, "worker")
    run = check_stopped(code, out, err, tmp_path / "out", at, signal.SIGTERM)
    assert f"path: {text_file}" in (run / "config.yaml").read_text()
    assert load_json(run / "run.json")["invocation"]["paths_given"] == {"data.path": relative}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run([sys.executable, "-m", "ddp_runner", "resume=last", f"output.root={tmp_path / 'out'}"],
                       cwd=elsewhere, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resume=last: continuing {run}" in r.stdout
    check_resumed_exactly(run, gpt_dropout_reference, r.stdout + r.stderr)


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
    """In bf16 with dropout: conftest.gpt_fsdp_reference, which test_strategies.py's SIGKILL under fsdp resumes to
    as well."""
    at = random.randint(3, 11)
    code, out, err = stop_mid_run([*with_default_checkpoints(gpt_fsdp_args(text_file)), *SLOW], tmp_path / "out", at,
                                  "driver")
    run = check_stopped(code, out, err, tmp_path / "out", at, signal.SIGINT)
    shards = Path(ck.latest(f"{run}/checkpoints")) / "shards"
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    r = ddp_run([f"resume={run}"], tmp_path / "unused")
    assert r.returncode == 0, r.stdout + r.stderr
    check_resumed_exactly(run, gpt_fsdp_reference, r.stdout + r.stderr)


def test_a_stop_during_the_final_validation_keeps_every_step_and_the_resume_validates(tmp_path, text_file):
    """SIGINT to the driver during the end validation (rank 0 sends it as that validation begins and waits until the
    stop reaches it: faults.in_phase): the final checkpoint holds every step, the run ends interrupted after its last
    step, and ``resume=<run dir>`` runs only the final validation (docs/resume.md)."""
    from ddp_runner.tasks.engine.diagnostics import faults

    args = [a for a in with_default_checkpoints(gpt_dropout_args(text_file))
            if not a.startswith(("train.max_steps=", "train.epochs="))] + ["train.max_steps=4", "train.warmup_steps=1"]
    r = ddp_run(args, tmp_path / "out", env={faults.ENV_STOP_AT: "validation@4"})
    [run] = run_dirs(tmp_path / "out")
    assert r.returncode == 128 + signal.SIGINT, r.stdout + r.stderr
    manifest, summary = load_json(run / "run.json"), load_json(run / "summary.json")
    assert manifest["status"] == summary["status"] == "interrupted", r.stderr
    latest = ck.latest(f"{run}/checkpoints")
    assert latest is not None and latest.endswith("step_4"), f"the final checkpoint: no step lost\n{r.stderr}"
    stopped = load_json(run / "logs/rank0.json").get("stopped") or {}
    assert stopped.get("step") == 4 and stopped["last_step"] and stopped["during"] == "the final validation", stopped
    assert summary["steps"] == 4 and len(summary["losses"]) == 4 and summary["val_loss"] is None
    assert "every rank stopped after step 4, the last, during the final validation" in r.stderr, r.stderr
    assert f"ddp-run resume={run}" in r.stderr and "no checkpoint was committed" not in r.stderr

    committed = (Path(latest) / "meta.json").stat().st_mtime_ns
    again = ddp_run([f"resume={run}"], tmp_path / "unused")
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = load_json(run / "summary.json")
    assert resumed["status"] == "completed" and resumed["steps"] == 4 and resumed["val_loss"] is not None
    assert resumed["losses"] == summary["losses"] and resumed["resumed_from"].endswith("step_4")
    assert not re.search(r"^\s*step [1-4]/4 .*loss [\d.]+ ", again.stdout, re.M), "no step trained again"
    assert tb_points(run, "val/loss") == [4] and tb_points(run, "train/loss") == [1, 2, 3, 4]
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
