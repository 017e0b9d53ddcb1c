"""The memory planner's arithmetic (pure: no torch, no processes) and its refusal through the real CLI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

from ddp_runner.config import memory_plan as mp  # noqa: E402
from ddp_runner.config.plan import Plan  # noqa: E402
from ddp_runner.contract.errors import PlanError  # noqa: E402

GIB = 2**30
N = 1_000_000_000  # a round parameter count: 4N bytes = 3.725 GiB
FACTS = mp.ModelFacts(params=N, largest_unit=N // 10, root=N // 20, arch=None)


def _plan(world_size: int = 2, per_rank: int = 8, accumulation: int = 1, device: str = "cuda") -> Plan:
    return Plan(world_size, per_rank, accumulation, per_rank * world_size * accumulation, device, "nccl", 1,
                world_size)


def _est(strategy: str, **kw) -> dict[str, float]:
    args = {"world_size": 2, "per_rank": 8, "accumulation": 1, "precision": "bf16", "cuda": False, **kw}
    return mp.estimate(FACTS, strategy, **args)


def test_state_bytes_per_parameter_under_each_strategy():
    ddp, zero1, fsdp = _est("ddp"), _est("zero1"), _est("fsdp")
    # DDP: fp32 weights, fp32 grads, AdamW's two fp32 moments, autocast's bf16 weight copies.
    assert (ddp["params_gb"], ddp["grads_gb"], ddp["optimizer_gb"]) == pytest.approx((4 * N / GIB, 4 * N / GIB,
                                                                                       8 * N / GIB))
    assert ddp["transient_gb"] == pytest.approx((2 + 4) * N / GIB)  # + DDP's reduced copy of the gradients
    assert _est("ddp", world_size=1)["transient_gb"] == pytest.approx(2 * N / GIB)
    # ZeRO-1: only the optimizer state is split.
    assert zero1["optimizer_gb"] == pytest.approx(4 * N / GIB) and zero1["params_gb"] == ddp["params_gb"]
    # FSDP: everything split; gathered: the root and two blocks in bf16, two blocks' fp32 grads.
    assert fsdp["params_gb"] == pytest.approx(2 * N / GIB) and fsdp["optimizer_gb"] == pytest.approx(4 * N / GIB)
    assert fsdp["transient_gb"] == pytest.approx((2 * (N // 20 + 2 * N // 10) + 8 * N // 10) / GIB)
    assert fsdp["total_gb"] < zero1["total_gb"] < ddp["total_gb"]
    # At world size 1 nothing is split and FSDP gathers nothing.
    one = _est("fsdp", world_size=1)
    assert one["params_gb"] == ddp["params_gb"] and one["transient_gb"] == 0
    assert _est("zero1", world_size=1)["optimizer_gb"] == ddp["optimizer_gb"]


def test_fsdp_gradients_add_to_the_peak_only_beyond_the_activations():
    """FSDP drops its gradients after each step; the backward makes them as it frees the activations."""
    arch = {"layers": 12, "width": 768, "heads": 12, "context": 1024, "vocab": 50304, "loss": "fused"}
    facts = mp.ModelFacts(N, N // 10, N // 20, arch)
    args = {"world_size": 2, "accumulation": 1, "precision": "bf16", "cuda": True}
    small = mp.estimate(facts, "fsdp", per_rank=8, **args)
    assert small["activations_gb"] > 4 * N / 2 / GIB and small["grads_gb"] == 0
    none = mp.estimate(mp.ModelFacts(N, N // 10, N // 20, None), "fsdp", per_rank=8, **args)  # no activations known
    assert none["grads_gb"] == pytest.approx(4 * N / 2 / GIB)
    assert mp.estimate(facts, "ddp", per_rank=8, **args)["grads_gb"] == pytest.approx(4 * N / GIB)
    # Sharded gradients accumulated over micro-steps live through the next forward: all of them count.
    kept = {**args, "accumulation": 2}
    assert mp.estimate(facts, "fsdp", per_rank=8, **kept)["grads_gb"] == 0  # accumulated unsharded (transient)
    assert mp.estimate(facts, "fsdp", per_rank=8, **kept, accumulate_unsharded=False)["grads_gb"] == \
        pytest.approx(4 * N / 2 / GIB)
    assert mp.estimate(facts, "fsdp", per_rank=8, **{**kept, "world_size": 1})["grads_gb"] == \
        pytest.approx(4 * N / GIB)


def test_fsdp_accumulation_holds_the_unsharded_model_unless_told_not_to():
    held = _est("fsdp", accumulation=4)["transient_gb"]
    assert held == pytest.approx((2 + 4) * N / GIB)  # bf16 parameters and fp32 gradients, whole
    assert _est("fsdp", accumulation=4, accumulate_unsharded=False)["transient_gb"] < held
    assert _est("ddp", optimizer="sgd")["optimizer_gb"] == 0
    assert _est("ddp", optimizer="sgd", momentum=0.9)["optimizer_gb"] == pytest.approx(4 * N / GIB)


def test_gpt2_small_activations_follow_the_megatron_formula():
    arch = {"layers": 12, "width": 768, "heads": 12, "context": 1024, "vocab": 50304, "loss": "fused"}
    per_sample = mp.activation_bytes_per_sample(arch, "bf16", flash=True)
    # 34·d per layer less the two dropout masks (no dropout), the fp32 sums, and the fused loss's bf16 logits.
    assert per_sample == 1024 * (12 * 32 * 768 + 12 * 768 + 50304 * 2)
    assert mp.activation_bytes_per_sample({**arch, "dropout": 0.1}, "bf16", flash=True) == \
        per_sample + 1024 * 12 * 2 * 768
    assert mp.activation_bytes_per_sample(arch, "fp32", flash=True) > 1.9 * per_sample
    # Without a fused attention kernel the scores count; without the fused loss, its logits and their fp32 copy.
    assert mp.activation_bytes_per_sample(arch, "bf16", flash=False) > per_sample
    assert mp.activation_bytes_per_sample({**arch, "loss": "plain"}, "bf16", flash=True) == \
        per_sample + 1024 * 50304 * 4
    assert mp.activation_bytes_per_sample(None, "bf16", flash=True) is None
    assert mp.activation_bytes_per_sample({"width": 8}, "bf16", flash=True) is None


def test_refusal_names_the_numbers_and_a_strategy_that_fits():
    plan = _plan()
    est = mp.plan_all(FACTS, {"train": {"precision": "bf16"}}, plan)
    cap = (est["fsdp"]["total_gb"] + est["zero1"]["total_gb"]) / 2
    mp.decide(est, "fsdp", cap, "test", plan)  # fits: no refusal
    with pytest.raises(PlanError) as e:
        mp.decide(est, "ddp", cap, "test", plan)
    assert e.value.key == "strategy" and e.value.value == "ddp"
    assert f"{est['ddp']['total_gb']:.3g} GiB" in e.value.problem and "parameters" in e.value.problem
    assert e.value.fix.startswith("use strategy=fsdp")
    mp.decide(est, "ddp", None, "no limit (CPU)", plan)  # no cap: nothing refused


def test_a_suggested_plan_leaves_the_planners_error_to_spare_and_a_tight_one_is_warned_about():
    plan = _plan()
    est = mp.plan_all(FACTS, {"train": {"precision": "bf16"}}, plan)
    cap = est["fsdp"]["total_gb"] / 0.9  # fsdp fits, but with less than 15% to spare
    assert est["zero1"]["total_gb"] > cap
    with pytest.raises(PlanError) as e:
        mp.decide(est, "ddp", cap, "test", plan)
    assert not e.value.fix.startswith("use strategy=fsdp ("), e.value.fix  # a smaller batch instead
    memory = {"strategy": "fsdp", "estimates": est, "cap_gb": cap}
    assert "inside the planner's error" in mp.tight(memory)
    assert mp.tight({**memory, "cap_gb": est["fsdp"]["total_gb"] / 0.8}) is None
    assert mp.tight({**memory, "cap_gb": None}) is None


def test_when_no_strategy_fits_the_fix_is_a_smaller_batch_or_more_gpus():
    arch = {"layers": 12, "width": 768, "heads": 12, "context": 1024, "vocab": 50304, "loss": "fused"}
    facts = mp.ModelFacts(params=124_000_000, largest_unit=7_000_000, root=40_000_000, arch=arch)
    plan = _plan(per_rank=64)
    est = mp.plan_all(facts, {"train": {"precision": "bf16"}}, plan)
    state = est["fsdp"]["total_gb"] - est["fsdp"]["activations_gb"]
    with pytest.raises(PlanError) as e:
        mp.decide(est, "fsdp", state + est["fsdp"]["activations_gb"] / 4, "test", plan)
    m = re.search(r"batch\.per_rank=(\d+)", e.value.fix)
    assert m and 1 <= int(m.group(1)) < 64 and "batch.global=128" in e.value.fix
    # Room for 3 samples per rank, but 3 does not divide the 64 per rank of the global batch: 2 does.
    one = est["fsdp"]["activations_gb"] / 64
    with pytest.raises(PlanError) as e:
        mp.decide(est, "fsdp", state + 3.5 * one, "test", plan)
    assert "batch.per_rank=2 " in e.value.fix, e.value.fix
    with pytest.raises(PlanError) as e:
        mp.decide(est, "fsdp", state / 2, "test", plan)
    assert "no strategy fits" in e.value.fix


def test_fsdp_with_small_micro_steps_is_told_the_largest_micro_batch_that_fits():
    arch = {"layers": 12, "width": 768, "heads": 12, "context": 1024, "vocab": 50304, "loss": "fused"}
    facts = mp.ModelFacts(params=124_000_000, largest_unit=7_000_000, root=40_000_000, arch=arch)
    cfg = {"train": {"precision": "bf16"}, "strategy": {"name": "fsdp"}}
    plan = _plan(world_size=1, per_rank=16, accumulation=4)  # GPT-2 small's preset under fsdp: 16 x 4
    at = {b: mp.estimate(facts, "fsdp", world_size=1, per_rank=b, accumulation=64 // b, precision="bf16")["total_gb"]
          for b in (16, 32, 64)}
    # A cap where 32 fits with the planner's headroom and 64 does not: 32, and its own estimate.
    cap = (at[32] + at[64]) / 2 / mp.HEADROOM
    assert mp.larger_fsdp_micro_batch(facts, cfg, plan, cap) == (32, at[32])
    assert mp.larger_fsdp_micro_batch(facts, cfg, plan, 140.0) == (64, at[64])  # an H200: one micro-step of 64
    assert mp.larger_fsdp_micro_batch(facts, cfg, plan, at[16] / mp.HEADROOM) is None  # nothing larger fits
    assert mp.larger_fsdp_micro_batch(facts, cfg, _plan(world_size=1, per_rank=64), 140.0) is None  # no accumulation
    assert mp.larger_fsdp_micro_batch(facts, cfg, _plan(1, 16, 4, device="cpu"), 140.0) is None
    memory = {"strategy": "fsdp", "cap_gb": 140.0, "fsdp_micro_batch": 64, "fsdp_micro_batch_gb": at[64]}
    hint = mp.fsdp_micro_batch_hint(memory, plan)
    assert "batch.per_rank=64 (accumulation 1, the same global batch 64)" in hint and "4 micro-steps of 16" in hint
    assert mp.fsdp_micro_batch_hint({**memory, "strategy": "ddp"}, plan) is None
    assert mp.fsdp_micro_batch_hint({"strategy": "fsdp", "cap_gb": None}, plan) is None


def test_cap_source_order(monkeypatch):
    monkeypatch.delenv("DDP_RUNNER_MEMORY_CAP_GB", raising=False)
    assert mp.cap_gb({}, 139.8) == (139.8, "the GPU's total memory")
    assert mp.cap_gb({}, None)[0] is None
    monkeypatch.setenv("DDP_RUNNER_MEMORY_CAP_GB", "40")
    assert mp.cap_gb({}, 139.8) == (40.0, "DDP_RUNNER_MEMORY_CAP_GB")
    assert mp.cap_gb({"strategy": {"memory_cap_gb": 20}}, 139.8) == (20.0, "strategy.memory_cap_gb")


def test_the_refused_plan_bench_reads_the_fix_the_planner_writes():
    """bench/refused_plan.py runs the fix it reads from the refusal: both of the planner's kinds of fix parse."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("refused_plan", ROOT / "bench" / "refused_plan.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    plan = _plan(per_rank=64)
    arch = {"layers": 12, "width": 768, "heads": 12, "context": 1024, "vocab": 50304, "loss": "fused"}
    est = mp.plan_all(mp.ModelFacts(124_000_000, 7_000_000, 40_000_000, arch), {"train": {"precision": "bf16"}}, plan)
    user = ["task=gpt2_small", "strategy=ddp", "batch.per_rank=64"]
    small = mp.plan_all(FACTS, {"train": {"precision": "bf16"}}, _plan())
    with pytest.raises(PlanError) as e:  # a strategy fits
        mp.decide(small, "ddp", (small["fsdp"]["total_gb"] + small["zero1"]["total_gb"]) / 2, "test", _plan())
    assert bench.fixed_args(user, f"  fix:   {e.value.fix}\n") == ["task=gpt2_small", "batch.per_rank=64",
                                                                   "strategy=fsdp"]
    state = est["fsdp"]["total_gb"] - est["fsdp"]["activations_gb"]
    with pytest.raises(PlanError) as e:  # a smaller batch
        mp.decide(est, "fsdp", state + est["fsdp"]["activations_gb"] / 2, "test", plan)
    fixed = bench.fixed_args(user, f"  fix:   {e.value.fix}\n")
    assert fixed[0] == "task=gpt2_small" and "strategy=fsdp" in fixed and "strategy.accumulate_unsharded=false" in fixed
    [per_rank] = [a for a in fixed if a.startswith("batch.per_rank=")]
    assert "batch.global=128" in fixed and per_rank != "batch.per_rank=64"
