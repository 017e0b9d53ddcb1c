"""The plan is pure: batch arithmetic and every refusal, without starting anything."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddp_runner.config.devices import select_visible
from ddp_runner.config.plan import Gpu, derive_accumulation, make_plan
from ddp_runner.contract.errors import PlanError

GPUS = [Gpu(0, "NVIDIA H200", "GPU-aaa"), Gpu(1, "NVIDIA H200", "GPU-bbb")]


def cfg(**over):
    base = {
        "world_size": 2, "batch": {"per_rank": 8, "accumulation": 1, "global": None},
        "device": "cpu", "backend": "auto", "task": {"name": "smoke"}, "launcher": {"nnodes": 1},
        "train": {"precision": "fp32", "max_steps": None, "epochs": 2, "optimizer": "sgd",
                  "schedule": "constant"},
    }
    for dotted, value in over.items():
        node = base
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return base


def test_explanation_and_manifest_keys():
    plan = make_plan(cfg(batch__accumulation=2), [])
    assert plan.global_batch == 32
    assert plan.explanation == "global batch 32 = 8 per rank × 2 ranks × 2 accumulation"
    m = plan.to_manifest()
    assert {k: m[k] for k in ("world_size", "per_rank_batch", "accumulation", "global_batch")} == {
        "world_size": 2, "per_rank_batch": 8, "accumulation": 2, "global_batch": 32}
    assert (plan.device, plan.backend) == ("cpu", "gloo")


@given(st.integers(1, 64), st.integers(1, 512), st.integers(1, 32))
def test_global_batch_is_the_product(ws, per_rank, acc):
    plan = make_plan(cfg(world_size=ws, batch__per_rank=per_rank, batch__accumulation=acc), [])
    assert plan.global_batch == per_rank * ws * acc


@given(st.integers(1, 16), st.integers(1, 64), st.integers(1, 16))
def test_fixed_global_batch_derives_accumulation(ws, per_rank, acc):
    g = ws * per_rank * acc
    plan = make_plan(cfg(world_size=ws, batch__per_rank=per_rank, batch__global=g, batch__accumulation=99), [])
    assert plan.accumulation == acc and plan.global_batch == g


@given(st.integers(1, 10_000), st.integers(1, 64), st.integers(1, 16))
def test_indivisible_global_batch_is_refused(g, per_rank, ws):
    if g % (per_rank * ws) == 0:
        assert derive_accumulation(g, per_rank, ws) * per_rank * ws == g
    else:
        with pytest.raises(PlanError) as e:
            derive_accumulation(g, per_rank, ws)
        assert e.value.key == "batch.global" and str(per_rank * ws) in e.value.problem


def test_auto_device_and_backend():
    plan = make_plan(cfg(device="auto"), GPUS)
    assert (plan.device, plan.backend) == ("cuda", "nccl")
    assert [g.physical_index for g in plan.gpus] == [0, 1]
    assert make_plan(cfg(device="auto"), []).backend == "gloo"
    assert make_plan(cfg(device="auto", world_size="auto"), GPUS).world_size == 2


@pytest.mark.parametrize("over, gpus, key", [
    ({"world_size": 3, "device": "cuda"}, GPUS, "world_size"),
    ({"device": "cuda"}, [], "device"),
    ({"backend": "nccl"}, [], "backend"),
    ({"backend": "nccl", "device": "cpu"}, GPUS, "backend"),
    ({"world_size": 0}, [], "world_size"),
    ({"world_size": "auto"}, [], "world_size"),
    ({"batch__per_rank": -1}, [], "batch.per_rank"),
    ({"batch__accumulation": 0}, [], "batch.accumulation"),
    ({"batch__global": 30}, [], "batch.global"),
    ({"batch__global": -16}, [], "batch.global"),
    ({"device": "tpu"}, [], "device"),
    ({"train__precision": "fp8"}, [], "train.precision"),
    ({"train__optimizer": "lamb"}, [], "train.optimizer"),
    ({"train__schedule": "linear"}, [], "train.schedule"),
])
def test_refusals_name_key_value_and_fix(over, gpus, key):
    with pytest.raises(PlanError) as e:
        make_plan(cfg(**over), gpus)
    assert e.value.key == key
    msg = str(e.value)
    assert key in msg and "Fix:" in msg and repr(e.value.value) in msg


def test_too_small_dataset_is_refused():
    with pytest.raises(PlanError) as e:
        make_plan(cfg(), [], train_samples=15)
    assert "15 samples" in e.value.problem and "2 × 8 = 16" in e.value.problem
    make_plan(cfg(), [], train_samples=16)


def test_local_rank_indexes_visible_devices():
    gpus = [Gpu(i, "H200", f"GPU-{i}{i}{i}") for i in range(4)]
    assert [g.physical_index for g in select_visible(gpus, "2,0")] == [2, 0]
    assert [g.physical_index for g in select_visible(gpus, "GPU-333")] == [3]
    assert select_visible(gpus, "") == []
    assert [g.physical_index for g in select_visible(gpus, "1,9,2")] == [1]  # CUDA stops at an invalid id
    plan = make_plan(cfg(device="cuda"), select_visible(gpus, "3,1"))
    assert [g.physical_index for g in plan.gpus] == [3, 1]


def test_inductor_settings_are_checked_against_the_known_ones():
    known = {"combo_kernels": False, "triton.cudagraphs": False, "max_autotune_gemm_backends": "ATEN,TRITON"}
    ok = cfg(train__compile=True, train__inductor={"combo_kernels": True, "triton": {"cudagraphs": True},
                                                   "max_autotune_gemm_backends": "ATEN"})
    assert make_plan(ok, [], inductor_settings=known).world_size == 2
    with pytest.raises(PlanError) as e:
        make_plan(cfg(train__compile=True, train__inductor={"triton": {"nope": 1}}), [], inductor_settings=known)
    assert e.value.key == "train.inductor.triton.nope"
    with pytest.raises(PlanError) as e:
        make_plan(cfg(train__compile=True, train__inductor={"combo_kernels": "yes"}), [], inductor_settings=known)
    assert e.value.key == "train.inductor.combo_kernels" and "true or false" in e.value.fix
    with pytest.raises(PlanError) as e:  # without compile the settings would silently do nothing
        make_plan(cfg(train__inductor={"combo_kernels": True}), [], inductor_settings=known)
    assert "train.compile" in e.value.fix


def test_bf16_gradient_all_reduce_needs_nccl():
    assert make_plan(cfg(device="cuda", train__ddp_comm="bf16"), GPUS).backend == "nccl"
    with pytest.raises(PlanError) as e:
        make_plan(cfg(train__ddp_comm="bf16"), [])
    assert e.value.key == "train.ddp_comm" and "fp32" in e.value.fix


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_profile_steps_must_be_a_whole_number(value):
    with pytest.raises(PlanError) as e:
        make_plan(cfg(train__profile={"steps": value, "start": 0}), [])
    assert e.value.key == "train.profile.steps"


def _gpt(**model):
    base = {"layers": 2, "heads": 2, "width": 64, "context": 64, "vocab": 256, "dropout": 0.0}
    return {"task": {"name": "gpt", "model": {**base, **model}}, "data": {"name": "text", "path": None}}


@pytest.mark.parametrize("key,value", [("attention", "fast"), ("loss", "chunked"), ("loss", 1), ("width", 0),
                                       ("heads", -2), ("dropout", 1.5)])
def test_gpt_choices_are_checked_by_the_task_hook(key, value):
    from ddp_runner.tasks.gpt.checks import check

    with pytest.raises(PlanError) as e:
        check(_gpt(**{key: value}))
    assert e.value.key == f"task.model.{key}" and e.value.value == value
    check(_gpt(attention="cudnn", loss="plain"))


def test_gpt_width_must_divide_into_heads():
    from ddp_runner.tasks.gpt.checks import check

    with pytest.raises(PlanError) as e:
        check(_gpt(width=64, heads=3))
    assert e.value.key == "task.model.width" and "multiple of 3" in e.value.fix


def test_gpt_vocab_smaller_than_the_data_needs_is_refused():
    from ddp_runner.tasks.gpt.checks import check

    with pytest.raises(PlanError) as e:
        check(_gpt(vocab=200))
    assert e.value.key == "task.model.vocab" and "256" in e.value.problem


def test_more_cpu_ranks_than_cores_is_said_not_refused():
    from ddp_runner.config.plan import cpu_oversubscribed, usable_cores

    four = make_plan(cfg(world_size=4), [])
    assert cpu_oversubscribed(four, 2) == (
        "world_size: 4 CPU ranks on this host, which has 2 CPU cores for them: the ranks share cores and every step"
        " waits for the slowest. Fix: world_size=2 or fewer on this host (or run more nodes); this runs, slowly")
    assert cpu_oversubscribed(four, 4) is None and "1 CPU core for" in cpu_oversubscribed(four, 1)
    assert cpu_oversubscribed(make_plan(cfg(world_size=2, device="cuda"), GPUS), 1) is None  # GPU ranks: no
    assert usable_cores() >= 1
