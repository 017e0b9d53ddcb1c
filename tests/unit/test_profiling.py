"""train.profile: the trace summary (pure, on hand-made events) and a traced CPU run through the CLI."""

from __future__ import annotations

import pytest

from ddp_runner.tasks.engine.diagnostics.profiling import categorize, format_summary, summarize


def _k(name: str, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


@pytest.mark.parametrize("name, cat", [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "matmul"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<...>", "attention"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("triton_per_fused__to_copy_add_native_layer_norm_backward_view_9", "fused elementwise"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
     "multi-tensor (optimizer, clip, accumulate)"),
    ("ce_rows_inplace", "loss (fused cross-entropy)"),
    ("Memcpy HtoD (Pinned -> Device)", "memory copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "other"),
])
def test_categories(name, cat):
    assert categorize(name) == cat


def test_busy_time_and_exposed_communication():
    # One 10 ms step (µs in the trace): compute 0-4 and 3-6 (busy 6 ms, overlap counted once), an all-reduce
    # 5-8 on another stream (1 ms hidden behind compute, 2 ms exposed), a copy 9-9.5.
    events = [
        _k("nvjet_gemm", 0, 4000), _k("triton_poi_fused_gelu", 3000, 3000),
        {**_k("ncclDevKernel_AllReduce", 5000, 3000), "tid": 17},
        _k("Memcpy HtoD", 9000, 500, cat="gpu_memcpy"),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 9999},  # host ops are not device time
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1},
    ]
    s = summarize(events, steps=1, wall_s=0.010)
    assert s["step_wall_ms"] == pytest.approx(10.0)
    assert s["compute_busy_ms"] == pytest.approx(6.5)
    assert s["communication_ms"] == pytest.approx(3.0)
    assert s["communication_exposed_ms"] == pytest.approx(2.0)
    assert s["by_category_ms"] == pytest.approx({"matmul": 4.0, "fused elementwise": 3.0, "communication": 3.0,
                                                 "memory copy": 0.5})
    assert s["top_kernels_ms"][0] == {"name": "nvjet_gemm", "category": "matmul", "ms": pytest.approx(4.0)}
    assert "exposed 2.00 ms" in format_summary(s)


def test_per_step_figures_divide_by_the_traced_steps():
    events = [_k("nvjet_gemm", 0, 4000), _k("nvjet_gemm", 10_000, 4000)]
    s = summarize(events, steps=2, wall_s=0.020)
    assert s["step_wall_ms"] == pytest.approx(10.0) and s["compute_busy_ms"] == pytest.approx(4.0)
    assert s["communication_exposed_ms"] == 0.0


def test_cpu_trace_without_device_kernels_says_so():
    s = summarize([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}], steps=1, wall_s=0.001)
    assert s["by_category_ms"] == {} and "no device kernels" in format_summary(s)
