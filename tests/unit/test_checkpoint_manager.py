"""The checkpoint manager's pure decisions (which source a run resumes from, when a save is due, whether a
checkpoint can continue this run), the shared integrity and resume rules (runner/contract/checkpoints.py), the
strategy protocol's declared extras, and the save path's one hook point. No process group, no subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ddp_runner.contract import checkpoints as rules
from ddp_runner.tasks.engine import checkpoint as ck
from ddp_runner.tasks.engine.checkpoint import compat, manager
from ddp_runner.tasks.engine.config import BatchPlan, Config, batch_plan
from ddp_runner.tasks.engine.diagnostics import faults
from ddp_runner.tasks.engine.strategy.base import Strategy

# -- the contract: integrity ----------------------------------------------------------------------------------


def _marker(**over: object) -> dict:
    return {"format": rules.FORMAT, "step": 4, "time": 0.0, "state_file": "state.pt", "bytes": 100,
            "sha256": "ab", **over}


def test_a_marker_counts_only_when_valid() -> None:
    assert rules.parse_marker(json.dumps(_marker())) == _marker()
    assert rules.parse_marker(json.dumps(_marker()).encode(), step=4) is not None
    assert rules.parse_marker(_marker(), step=5) is None  # another step's marker
    assert rules.parse_marker(_marker(format="other/1")) is None
    assert rules.parse_marker(_marker(bytes="100")) is None
    assert rules.parse_marker(_marker(state_file="x.pt")) is None
    assert rules.parse_marker("{not json") is None and rules.parse_marker("[1]") is None


def test_size_problem_names_what_the_driver_and_the_workers_refuse() -> None:
    assert rules.size_problem("step_4", json.dumps(_marker()), 100) is None
    assert rules.size_problem("step_4", _marker(), 99) == "step_4: state.pt is 99 bytes, meta.json says 100"
    assert rules.size_problem("step_4", _marker(), None) == "step_4: state.pt is missing although meta.json exists"
    assert rules.size_problem("step_4", None, 100) == "step_4: meta.json is missing"
    assert rules.size_problem("step_4", "{oops", 100) == "step_4: meta.json is not valid"
    assert rules.size_problem("step_4", {"bytes": None}, 100) == "step_4: meta.json is not valid"
    # The driver reads markers it has not validated: only the recorded size matters to this check.
    assert rules.size_problem("step_4", '{"bytes": 7}', 7) is None


def test_listed_files_and_digests() -> None:
    assert rules.file_size_problem("u", "shards/a", 5, None) == "u: shards/a is missing although meta.json lists it"
    assert rules.file_size_problem("u", "shards/a", 5, 4) == "u: shards/a is 4 bytes, meta.json says 5"
    assert rules.file_size_problem("u", "shards/a", 5, 5) is None
    assert rules.listed_files(_marker(files={"model.pt": 3})) == {"model.pt": 3} and rules.listed_files(_marker()) == {}
    assert rules.digest_problem("u", "ab", "ab") is None
    assert "sha256 of state.pt does not match meta.json" in rules.digest_problem("u", "ab", "cd")


def test_step_directory_names() -> None:
    assert rules.step_dir_name(12) == "step_12" and rules.step_of("step_12") == 12
    assert rules.step_of("step_12.tmp-ab12") is None and rules.step_of("step_") is None
    for bad in (-1, True, 1.0):
        with pytest.raises(ValueError):
            rules.step_dir_name(bad)  # type: ignore[arg-type]


# -- the contract: the resume rule ----------------------------------------------------------------------------


@pytest.mark.parametrize(("theirs", "mine", "ok"), [
    ((2, 32), (2, 32), True),     # same world
    ((2, 32), (2, 64), True),     # same world, another batch: the step size changed, the data order did not
    ((2, 32), (1, 32), True),     # another world at the same global batch: resharded
    ((None, None), (4, 8), True),  # a checkpoint without a plan
    ((2, 32), (1, 16), False),    # another world and another global batch: another optimisation problem
])
def test_another_world_size_only_at_the_same_global_batch(theirs, mine, ok) -> None:
    problem = rules.world_size_change_problem(*theirs, *mine)
    assert (problem is None) == ok
    if not ok:
        assert problem == "it ran with world_size=2 and global batch 32, this run has world_size=1 and global batch 16"


# -- the plan's global batch ----------------------------------------------------------------------------------


def test_the_global_batch_comes_from_one_place() -> None:
    plan = batch_plan(Config({"batch": {"per_rank": 4, "accumulation": 3}}), world_size=2)
    assert plan == BatchPlan(world_size=2, per_rank=4, accumulation=3) and plan.global_batch == 24
    assert plan.as_dict() == {"world_size": 2, "per_rank_batch": 4, "accumulation": 3, "global_batch": 24}


# -- compatibility verdicts -----------------------------------------------------------------------------------


def _ckpt_state(world: int = 2, per_rank: int = 4, acc: int = 2, micro: int = 3, **over: object) -> dict:
    plan = BatchPlan(world, per_rank, acc).as_dict()
    return {"model": {"w": torch.zeros(2, 3)}, "progress": {"step": 5, "epoch": 1, "micro_in_epoch": micro,
                                                            "losses": [1.0]},
            "plan": plan, **over}


def test_a_checkpoint_from_another_world_at_the_same_global_batch_continues_at_the_same_sample() -> None:
    state = _ckpt_state(world=2, per_rank=4, acc=2, micro=3)  # 3 micro-batches × 4 × 2 ranks = 24 samples
    here = BatchPlan(world_size=1, per_rank=4, accumulation=4)  # global batch 16 either way
    compat.check(state, "src", here, {"w": (2, 3)}, run_sharded=False, strategy_name="ddp")
    assert compat.samples_done(state, here) == 24
    progress = manager.restored_progress(state, here)
    assert (progress.step, progress.epoch, progress.micro_in_epoch, progress.losses) == (5, 1, 6, [1.0])


def test_compatibility_verdicts_name_the_reason() -> None:
    here = BatchPlan(1, 4, 2)
    with pytest.raises(ValueError, match=r"cannot resume from src: it ran with world_size=2 and global batch 16,"
                                         r" this run has world_size=1 and global batch 8\. Fix: resume with"
                                         r" batch.global=16 \(or world_size=2\)"):
        compat.check(_ckpt_state(), "src", here, {"w": (2, 3)}, run_sharded=False, strategy_name="ddp")
    with pytest.raises(ValueError, match=r"the model differs \(2 keys\): w: checkpoint \(2, 3\) vs model \(3, 3\);"
                                         r" b: missing in checkpoint"):
        compat.check(_ckpt_state(), "src", BatchPlan(2, 4, 2), {"w": (3, 3), "b": (3,)}, run_sharded=False,
                     strategy_name="ddp")
    with pytest.raises(ValueError, match=r"single-file \(strategy=ddp/zero1\) checkpoint and this run uses"
                                         r" strategy=fsdp"):
        compat.check(_ckpt_state(), "src", BatchPlan(2, 4, 2), {"w": (2, 3)}, run_sharded=True,
                     strategy_name="fsdp")
    # A sharded checkpoint holds no model to compare: DCP checks names and shapes as it loads.
    compat.check(_ckpt_state(model={}, sharded="shards"), "src", BatchPlan(2, 4, 2), {"w": (3, 3)},
                 run_sharded=True, strategy_name="fsdp")
    # 3 micro-batches of 4 on 2 ranks = 12 samples per rank: not a whole number of micro-batches of 8.
    with pytest.raises(ValueError, match=r"each rank had used 12 samples .* batch.per_rank=4 \(or a divisor of 12\)"):
        compat.check(_ckpt_state(), "src", BatchPlan(2, 8, 1), {"w": (2, 3)}, run_sharded=False,
                     strategy_name="ddp")


def test_model_problems_lists_every_difference() -> None:
    assert compat.model_problems({"a": (1,), "b": (2,)}, {"a": (1,), "b": (2,)}) == []
    assert compat.model_problems({"a": (1,), "x": (1,)}, {"a": (2,), "y": (1,)}) == [
        "a: checkpoint (1,) vs model (2,)", "y: missing in checkpoint", "x: not in this model"]
    assert compat.layout_problem(True, True, "fsdp") is None and compat.layout_problem(False, False, "ddp") is None


# -- when a save is due ---------------------------------------------------------------------------------------


def test_a_periodic_save_is_due_every_n_steps_but_not_at_the_last() -> None:
    assert [s for s in range(1, 11) if manager.save_due(s, 10, 4)] == [4, 8]
    assert [s for s in range(1, 9) if manager.save_due(s, 8, 4)] == [4]  # step 8 gets the final checkpoint
    assert not any(manager.save_due(s, 10, every) for s in range(1, 11) for every in (0, None))


# -- where a run resumes from ---------------------------------------------------------------------------------


def _save(root: Path, *steps: int) -> list[str]:
    return [ck.save(str(root), s, {"step": s}, keep_last=0) for s in steps]


def test_a_runs_own_checkpoints_win_whatever_resume_says(tmp_path: Path) -> None:
    own = _save(tmp_path / "run/checkpoints", 2, 4)
    other = _save(tmp_path / "other/checkpoints", 6)
    for resume in ("auto", "never", other[0], str(tmp_path / "other")):
        assert manager.resume_sources(resume, str(tmp_path / "run/checkpoints")) == manager.Sources(own[::-1])


def test_a_run_without_checkpoints_starts_where_resume_says(tmp_path: Path) -> None:
    mine = str(tmp_path / "run/checkpoints")
    assert manager.resume_sources("auto", mine) == manager.Sources([])
    assert manager.resume_sources("never", mine) == manager.Sources([])
    theirs = _save(tmp_path / "other/checkpoints", 2, 6)
    assert manager.resume_sources(theirs[0], mine) == manager.Sources([theirs[0]], explicit=True)
    # A run directory or its checkpoints/: every complete one, newest first (an older one is the fallback).
    assert manager.resume_sources(str(tmp_path / "other"), mine) == manager.Sources(theirs[::-1])
    assert manager.resume_sources(str(tmp_path / "other/checkpoints"), mine) == manager.Sources(theirs[::-1])
    with pytest.raises(ValueError, match="no complete checkpoint there"):
        manager.resume_sources(str(tmp_path / "nothing"), mine)


# -- the strategy protocol's extras ---------------------------------------------------------------------------


def test_every_strategy_extra_has_a_default() -> None:
    from ddp_runner.tasks.engine.strategy.ddp import DDPStrategy
    from ddp_runner.tasks.engine.strategy.fsdp import FSDPStrategy
    from ddp_runner.tasks.engine.strategy.zero1 import Zero1Strategy

    base = Strategy()
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    assert base.wrap_optimizer(opt) is opt
    assert base.on_grads_ready(lambda: None) is None  # accepted, never called
    assert (base.cudagraphs, base.full_state_on_rank0, base.sharded_checkpoint, base.collective_forward) == \
        (False, True, False, False)
    for cls in (DDPStrategy, Zero1Strategy, FSDPStrategy):
        assert issubclass(cls, Strategy)
    assert (FSDPStrategy.sharded_checkpoint, FSDPStrategy.collective_forward, FSDPStrategy.full_state_on_rank0) == \
        (True, True, False)
    assert (Zero1Strategy.sharded_checkpoint, Zero1Strategy.full_state_on_rank0) == (False, False)
    assert Zero1Strategy.wrap_optimizer is not Strategy.wrap_optimizer


# -- the save path's one hook point ---------------------------------------------------------------------------


def test_test_hooks_are_set_up_once_and_absent_in_a_real_run(tmp_path: Path) -> None:
    saved = faults._active
    try:
        faults.use(faults.Faults())
        assert faults.save_hooks() is None  # a real run: the save path calls nothing in faults.py
        faults.use(faults.Faults(slow_save=(3, 0.0)))
        assert isinstance(faults.save_hooks(), faults.CheckpointHooks)
    finally:
        faults.use(saved)


def test_a_save_calls_its_hooks_once_before_the_commit(tmp_path: Path) -> None:
    seen: list[tuple[int, str, bool]] = []

    class Recorder:
        def before_commit(self, step: int, url: str) -> None:
            seen.append((step, url, ck.is_checkpoint(url)))

    url = ck.save(str(tmp_path), 3, {"step": 3}, keep_last=0, hooks=Recorder())
    assert seen == [(3, url, False)] and ck.is_checkpoint(url)


def test_the_resume_line_promises_bit_for_bit_only_for_the_checkpoints_own_split() -> None:
    same = BatchPlan(world_size=3, per_rank=2, accumulation=4)
    saved = same.as_dict()
    assert compat.exactness(saved, same) == "the uninterrupted run's losses, bit for bit"
    assert compat.exactness({}, same) == "the uninterrupted run's losses, bit for bit"  # a checkpoint without a plan
    # On CUDA the same steps in the same order, but never a promise of the same bits (its kernels are not
    # deterministic: BENCHMARKS.md, two uninterrupted GPT-2 small runs on one H200).
    on_gpu = compat.exactness(saved, same, "cuda")
    assert on_gpu.startswith("the uninterrupted run's steps in the same order, but not bit for bit")
    assert "train.deterministic=true" in on_gpu  # the way to the same bits
    # ... which train.deterministic promises (torch's deterministic algorithms on), at the checkpoint's own split only
    assert compat.exactness(saved, same, "cuda", deterministic=True) == (
        "the uninterrupted run's losses, bit for bit (train.deterministic)")
    assert compat.exactness(saved, BatchPlan(world_size=4, per_rank=2, accumulation=3), "cuda",
                            deterministic=True).startswith("not bit for bit")
    for other in (BatchPlan(world_size=4, per_rank=2, accumulation=3), BatchPlan(world_size=3, per_rank=4,
                                                                                accumulation=2)):
        said = compat.exactness(saved, other)
        assert said.startswith("not bit for bit") and "bit for bit" not in said[len("not bit for bit"):]
        assert f"{other.world_size} ranks × {other.per_rank} × {other.accumulation}" in said
        assert "(was 3 ranks × 2 × 4)" in said
