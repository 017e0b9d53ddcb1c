"""Whether a checkpoint can continue this run: the verdicts a resume reaches before it loads any state.

Pure functions over the checkpoint's small state (``plan``, ``progress``, ``sharded``) and this run's facts; the
world-size rule is the one the driver applies before launch (``runner/contract/checkpoints.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ddp_runner.contract import checkpoints as rules
from ddp_runner.tasks.engine.config import BatchPlan

Shapes = Mapping[str, Sequence[int]]


def samples_done(state: Mapping[str, Any], plan: BatchPlan) -> int:
    """Samples of the current epoch all ranks together had used: with the sampler's strided split these are
    exactly the epoch's first ones, so a run at another world size continues at the same place. (A checkpoint
    without a plan counts in this run's.)"""
    theirs = state.get("plan", {})
    per_rank = theirs.get("per_rank_batch", plan.per_rank)
    return state["progress"]["micro_in_epoch"] * per_rank * theirs.get("world_size", plan.world_size)


def layout_problem(checkpoint_sharded: bool, run_sharded: bool, strategy_name: str) -> str | None:
    """Why a sharded checkpoint cannot load into a run that saves single files, or the reverse; None: it can."""
    if checkpoint_sharded == run_sharded:
        return None
    have = "sharded (strategy=fsdp)" if checkpoint_sharded else "single-file (strategy=ddp/zero1)"
    return (f"it is a {have} checkpoint and this run uses strategy={strategy_name}. Fix: resume it under the"
            " strategy that wrote it (at any world size), or start over with resume=never")


def model_problems(theirs: Shapes, mine: Shapes) -> list[str]:
    """Every key whose shape differs, or that only one side has, between a checkpoint's model and this one's."""
    problems = [f"{k}: checkpoint {tuple(v)} vs model {tuple(mine[k])}"
                for k, v in theirs.items() if k in mine and tuple(v) != tuple(mine[k])]
    problems += [f"{k}: missing in checkpoint" for k in mine if k not in theirs]
    problems += [f"{k}: not in this model" for k in theirs if k not in mine]
    return problems


def data_position_problem(state: Mapping[str, Any], plan: BatchPlan) -> str | None:
    """Why the checkpoint's place in the epoch is not a whole number of this run's micro-batches on every rank
    (the data order would not continue exactly); None when it is."""
    done_all = samples_done(state, plan)
    done = done_all // plan.world_size
    if done_all % plan.world_size or done % plan.per_rank:
        return (f"each rank had used {done} samples of the epoch, not a whole number of batch.per_rank="
                f"{plan.per_rank} micro-batches, so the data order would not continue exactly. Fix: resume with"
                f" batch.per_rank={state['plan']['per_rank_batch']} (or a divisor of {done})")
    return None


def exactness(their_plan: Mapping[str, Any], plan: BatchPlan, device_type: str = "cpu",
              deterministic: bool = False) -> str:
    """What the resumed losses promise, for the resume's console line (docs/resume.md, "Bit for bit").

    At the checkpoint's world size, per-rank batch and accumulation every step computes and sums what the
    uninterrupted run's would, in the same order (ddp and zero1 settle DDP's gradient buckets first): bit for bit
    where the kernels are deterministic, as on the CPU. CUDA's are not (two uninterrupted runs differ in the last
    bits too) unless ``deterministic`` (train.deterministic: torch's deterministic algorithms). Another split of
    the same global batch sums in another order: the same optimisation problem, not the same bits."""
    theirs = (their_plan.get("world_size"), their_plan.get("per_rank_batch"), their_plan.get("accumulation"))
    mine = (plan.world_size, plan.per_rank, plan.accumulation)
    if None in theirs or theirs == mine:
        if device_type == "cuda" and deterministic:
            return "the uninterrupted run's losses, bit for bit (train.deterministic)"
        if device_type == "cuda":
            return ("the uninterrupted run's steps in the same order, but not bit for bit: CUDA kernels are not"
                    " deterministic (two uninterrupted runs differ in the last bits too; train.deterministic=true"
                    " makes them so)")
        return "the uninterrupted run's losses, bit for bit"
    was = f"{theirs[0]} ranks × {theirs[1]} × {theirs[2]}"
    return (f"not bit for bit: the global batch is now {plan.world_size} ranks × {plan.per_rank} ×"
            f" {plan.accumulation} (was {was}), summed in another order; the same optimisation problem")


def check(state: Mapping[str, Any], src: str, plan: BatchPlan, model_shapes: Shapes, *, run_sharded: bool,
          strategy_name: str) -> None:
    """Raise ``ValueError`` naming the first reason the checkpoint ``state`` (loaded from ``src``) cannot
    continue this run: another checkpoint layout, another model, another global batch at another world size, or
    a data position this run's micro-batches cannot continue from. ``model_shapes``: this run's model's keys
    and shapes (only compared when the checkpoint holds a whole model: DCP checks a sharded one as it loads)."""
    checkpoint_sharded = bool(state.get("sharded"))
    if problem := layout_problem(checkpoint_sharded, run_sharded, strategy_name):
        raise ValueError(f"cannot resume from {src}: {problem}")
    theirs = {k: tuple(v.shape) for k, v in (state.get("model") or {}).items()}
    if problems := model_problems(theirs, model_shapes if theirs else {}):
        raise ValueError(f"cannot resume from {src}: the model differs ({len(problems)} keys): "
                         + "; ".join(problems[:8]) + ". Fix: resume with the same task.model settings")
    their_plan = state.get("plan", {})
    if problem := rules.world_size_change_problem(their_plan.get("world_size"), their_plan.get("global_batch"),
                                                  plan.world_size, plan.global_batch):
        # Another world size is fine (resharding), another optimisation problem is not.
        raise ValueError(f"cannot resume from {src}: {problem}. Fix: resume with batch.global="
                         f"{their_plan.get('global_batch')} (or world_size={their_plan['world_size']})")
    if problem := data_position_problem(state, plan):
        raise ValueError(f"cannot resume from {src}: {problem}")
