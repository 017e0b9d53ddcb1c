"""Checkpoints and recovery end to end: real torchrun, gloo ranks killed with SIGKILL, resumed through the CLI.

Every comparison is exact: a resumed or restarted run must give the same per-step losses (summary.json) and the
same final parameters (torch.equal) as one that was never interrupted.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from ddp_runner.tasks.engine import checkpoint as ck
from tests.support.driver import ddp_run
from tests.support.recipes import (
    GPT_DROPOUT_STEPS,
    KILL_SMOKE,
    SLOW_SAVE_STEP4,
    SMOKE_CKPT2,
    SMOKE_OOM_IN_FLIGHT,
    gpt_dropout_args,
)
from tests.support.run_tree import load_json, run_dirs
from tests.support.shared_runs import shared_console, shared_run

# smoke: 64 samples / (8 per rank × 2 ranks) = 4 optimizer steps per epoch, 2 epochs = 8 steps. With a
# checkpoint every 2 steps, killing rank 1 after step 7 leaves step_6 (epoch 1, 2 of 4 micro-batches done).
# (recipes.KILL_SMOKE: ["fault.kind=sigkill", "fault.rank=1", "fault.step=7"])
SMOKE = SMOKE_CKPT2


def only_run(root: Path) -> Path:
    [run] = run_dirs(root)
    return run


def final_params(run: Path | str) -> dict[str, torch.Tensor]:
    latest = ck.latest(f"{run}/checkpoints")
    assert latest is not None, f"no complete checkpoint in {run}"
    return ck.load(latest)["model"]


def assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def assert_killed(r, run: Path) -> None:
    assert r.returncode != 0, r.stdout + r.stderr
    assert load_json(run / "run.json")["status"] == "failed"


@pytest.fixture
def smoke_baseline(smoke_reference: Path) -> Path:
    """One uninterrupted smoke run (SMOKE) that the recovery tests compare against (made once per session)."""
    return smoke_reference


@pytest.fixture(scope="session")
def smoke_every_step(tmp_path_factory: pytest.TempPathFactory, smoke_reference: Path) -> Path:
    """SMOKE with a checkpoint every step (keep_last 2) and ``resume=never``, launched into the output root of
    smoke_reference, which already holds a run with checkpoints: a new run from step 0 (made once per session;
    test_resume_never_starts_a_new_run_from_step_0 and test_keep_last_and_resumed_from_checkpoint_is_protected
    read it)."""
    root = smoke_reference.parent.parent

    def make(_: Path) -> Path:
        before = run_dirs(root)
        r = ddp_run(["task=smoke", "device=cpu", "world_size=2", "checkpoint.every_steps=1", "checkpoint.keep_last=2",
                     "resume=never"], root)
        assert r.returncode == 0, r.stdout + r.stderr
        [new] = set(run_dirs(root)) - set(before)
        return new

    return shared_run(tmp_path_factory, "smoke-every-step", make)


def test_kill_then_resume_run_dir_is_bit_identical(tmp_path, text_file, gpt_dropout_reference):
    """The tiny GPT with AdamW, cosine schedule, clipping and dropout (recipes.gpt_dropout_args), killed mid-epoch
    and continued in place: the same per-step losses and parameters as the uninterrupted run.

    Also guards against a resume that does not restore the RNG state exactly (``set_rng_state`` skipped in
    ``maybe_resume``, or a draw between the restore and the first step): with dropout every step after the resume
    would draw other masks. (The in-process guard: test_guards.py::test_resume_restores_the_rng_state_...)"""
    args = gpt_dropout_args(text_file)
    clean = gpt_dropout_reference
    assert load_json(clean / "summary.json")["steps"] == GPT_DROPOUT_STEPS

    # Rank 1 is SIGKILLed after step 15; step_12 was saved in epoch 1 (steps 9-16), half-way through it.
    r = ddp_run([*args, "fault.kind=sigkill", "fault.rank=1", "fault.step=15"], tmp_path / "crash")
    crashed = only_run(tmp_path / "crash")
    assert_killed(r, crashed)
    assert ck.latest(f"{crashed}/checkpoints").endswith("step_12")

    # Continued in place keeping only 1 checkpoint, saved in the background (the crashed run kept all, saved
    # synchronously): the checkpoint it resumed from survives the newer saves (step_16) all the same.
    resumed_from = ck.latest(f"{crashed}/checkpoints")
    r = ddp_run([f"resume={crashed}", "checkpoint.keep_last=1", "checkpoint.async_save=true"], tmp_path / "unused")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "unused").exists(), "resume=<run dir> continues in place: no new run directory"
    summary, manifest = load_json(crashed / "summary.json"), load_json(crashed / "run.json")
    assert manifest["status"] == "completed" and summary["status"] == "completed"
    assert len(manifest["continued"]) == 1 and summary["root_cause"] is None
    assert summary["resumed_from"].endswith("checkpoints/step_12")
    assert summary["resumed_from"] == resumed_from
    assert ck.is_checkpoint(resumed_from) and ck.latest(f"{crashed}/checkpoints").endswith(f"step_{GPT_DROPOUT_STEPS}")
    assert [Path(u).name for _, u in ck.list_complete(f"{crashed}/checkpoints")] == ["step_12", "step_16"]
    progress = ck.load(summary["resumed_from"])["progress"]
    assert progress["epoch"] == 1 and 0 < progress["micro_in_epoch"] < 8, "the resume must land mid-epoch"
    assert "resumed from" in (crashed / "logs/rank0.log").read_text()
    assert not list((crashed / "logs").glob("*.error.json")), "the crash's error records were cleared"

    clean_summary = load_json(clean / "summary.json")
    assert summary["steps"] == GPT_DROPOUT_STEPS and len(clean_summary["losses"]) == GPT_DROPOUT_STEPS
    assert summary["losses"] == clean_summary["losses"], "per-step losses, before and after the resume"
    assert_same_params(final_params(crashed), final_params(clean))
    step = f"checkpoints/step_{GPT_DROPOUT_STEPS}"  # the last step's checkpoint of both, by name
    assert_same_params(ck.load(str(crashed / step))["model"], ck.load(str(clean / step))["model"])


def _failed_with_step4_in_flight(tmp_path: Path, fault: list[str]) -> tuple[Any, Path]:
    """A smoke run where rank 0's background write of step_4 is held for 8 s (a wide margin on a busy machine)
    while ``fault`` strikes; the run failed, and step_4 was finished all the same."""
    r = ddp_run([*SMOKE, "checkpoint.async_save=true", *fault], tmp_path / "out", env=SLOW_SAVE_STEP4)
    run = only_run(tmp_path / "out")
    assert_killed(r, run)
    assert ck.latest(f"{run}/checkpoints").endswith("step_4")
    return r, run


def test_rank0_finishes_the_checkpoint_in_flight_when_torchrun_stops_it(tmp_path):
    # After step 5, rank 1 fails and rank 0 blocks (asleep, so no collective can fail under it first), and
    # torchrun stops rank 0 with SIGTERM while step_4's write is in flight. Rank 0 finishes it before stopping
    # (tasks/engine/stop/signals.py), so the run resumes from step_4, not step_2. Without that, SIGTERM ended rank 0 and
    # the write with it.
    r, run = _failed_with_step4_in_flight(
        tmp_path, ["fault.kind=exception", "fault.rank=1", "fault.step=5", "fault.also=[{kind:hang,rank:0,step:5}]"])
    assert "SIGTERM: finished the checkpoint in flight" in (run / "logs/rank0.log").read_text()
    assert "injected fault on rank 1 at step 5" in r.stderr + r.stdout, "the root cause is still rank 1's"


def test_rank0_finishes_the_checkpoint_in_flight_when_its_collective_fails(smoke_oom_in_flight):
    # As above, but rank 0 goes on into the next step's collective. Which comes first is a race: the collective
    # failing because rank 1 is gone (rank 0 then finishes the write on its way out, tasks/__main__.py), or
    # torchrun's SIGTERM. Either way the write completes and the log says so. Rank 1's failure is the rehearsal
    # OOM (an exception on CPU): the session's run smoke_oom_in_flight (tests/e2e/conftest.py), whose root cause
    # test_diagnostics_e2e.py checks (one launch for both).
    run = smoke_oom_in_flight
    assert SMOKE_OOM_IN_FLIGHT == [*SMOKE, "checkpoint.async_save=true", "fault.kind=oom", "fault.rank=1",
                                   "fault.step=5"]
    console = shared_console(run)
    assert_killed(subprocess.CompletedProcess([], console["rc"], console["stdout"], console["stderr"]), run)
    assert ck.latest(f"{run}/checkpoints").endswith("step_4")
    log = (run / "logs/rank0.log").read_text()
    assert re.search(r"(SIGTERM|stopping after the error): finished the checkpoint in flight", log), log


def test_elastic_restart_recovers_and_is_recorded(tmp_path, smoke_baseline):
    r = ddp_run([*SMOKE, "launcher.max_restarts=1", *KILL_SMOKE], tmp_path / "out")
    assert r.returncode == 0, r.stdout + r.stderr
    run = only_run(tmp_path / "out")
    manifest, summary = load_json(run / "run.json"), load_json(run / "summary.json")
    assert manifest["status"] == "completed" and manifest["restarts"] >= 1
    assert manifest["exit_codes"] == {"0": 0, "1": 0}
    assert "--max-restarts=1" in manifest["command"]
    for rank in (0, 1):  # each rank reports the attempt it finished in (TORCHELASTIC_RESTART_COUNT)
        assert load_json(run / f"logs/rank{rank}.json")["restart_count"] == manifest["restarts"]
    assert summary["resumed_from"] and "/checkpoints/step_" in summary["resumed_from"]
    assert summary["losses"] == load_json(smoke_baseline / "summary.json")["losses"]
    assert_same_params(final_params(run), final_params(smoke_baseline))


def test_keep_last_and_resumed_from_checkpoint_is_protected(tmp_path, smoke_baseline, smoke_every_step):
    a = smoke_every_step  # every step checkpointed, keep_last 2
    assert [Path(u).name for _, u in ck.list_complete(f"{a}/checkpoints")] == ["step_7", "step_8"]
    assert sorted(p.name for p in (a / "checkpoints").iterdir()) == ["step_7", "step_8"], "no leftovers"

    # Into a new run from a checkpoint path, keeping only 1: the source (another run's) is never touched.
    source = a / "checkpoints/step_7"
    r = ddp_run(["task=smoke", "device=cpu", f"resume={source}", "train.epochs=3", "checkpoint.every_steps=1",
                 "checkpoint.keep_last=1"], tmp_path / "b")
    assert r.returncode == 0, r.stdout + r.stderr
    b = only_run(tmp_path / "b")
    summary = load_json(b / "summary.json")
    assert summary["resumed_from"] == str(source) and summary["steps"] == 12
    # The settings changed from the checkpoint's run apply from its step, and run.json says so (issue 30).
    changes = load_json(b / "run.json")["resume_changes"]
    assert changes["train.epochs"] == {"checkpoint": 2, "used": 3, "from_step": 7}, changes
    assert changes["checkpoint.keep_last"] == {"checkpoint": 2, "used": 1, "from_step": 7}, changes
    assert summary["losses"][:8] == load_json(smoke_baseline / "summary.json")["losses"]
    assert [Path(u).name for _, u in ck.list_complete(f"{b}/checkpoints")] == ["step_12"]
    assert ck.load(source)["progress"]["step"] == 7
    assert [Path(u).name for _, u in ck.list_complete(f"{a}/checkpoints")] == ["step_7", "step_8"]

    # A killed run continued in place with keep_last=1, whose checkpoint it resumed from survives the newer saves
    # (the run continues bit for bit all the same): test_kill_then_resume_run_dir_is_bit_identical, in the same
    # launch as its own resume.


def test_resume_never_starts_a_new_run_from_step_0(smoke_baseline, smoke_every_step):
    # A root that already holds a run with checkpoints: resume=never starts from scratch (smoke_every_step was
    # launched so into smoke_baseline's root).
    new = smoke_every_step
    assert new.parent.parent == smoke_baseline.parent.parent and new != smoke_baseline
    summary = load_json(new / "summary.json")
    assert summary["resumed_from"] is None and "resumed from" not in (new / "logs/rank0.log").read_text()
    assert summary["losses"] == load_json(smoke_baseline / "summary.json")["losses"]

    # (A missing source and one with no complete checkpoint, refused before launch: tests/integration/
    # test_resume_refusals.py::test_missing_resume_source_is_refused, in process.)


def test_epoch_based_resume_with_another_batch_finishes_the_same_epochs(tmp_path, smoke_baseline):
    # step_6 of the baseline: epoch 1 with 2 of its 4 micro-batches of 8 done, i.e. 16 of each rank's 32 samples.
    # At batch.per_rank=4 the rest of epoch 1 is 4 steps: the run ends at step 10, not at 2 epochs × 8 = 16.
    source = smoke_baseline / "checkpoints/step_6"
    r = ddp_run(["task=smoke", "device=cpu", f"resume={source}", "batch.per_rank=4", "train.epochs=2"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = load_json(only_run(tmp_path) / "summary.json")
    assert summary["steps"] == 10 and summary["epochs_started"] == 2
