"""End-to-end task=gpt through the CLI on CPU: real torchrun, 2 gloo ranks, TensorBoard read back.

Runs are short (the tiny preset is ~0.1M parameters) and validate on a sliver of the default corpus
(``data.val_fraction``): a full 10 % tail is ~19k windows, seconds per validation on a CPU. Two launches, each
shared with other files (tests/e2e/conftest.py): ``gpt_w2_reference`` (30 steps under accumulation 2) and
``gpt_bin_bf16_run`` (a uint16 token file, bf16 autocast).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support.recipes import GPT_BIN_STEPS, GPT_BIN_VOCAB, GPT_W2_STEPS
from tests.support.run_tree import load_json
from tests.support.shared_runs import shared_console

SCALARS = ("train/loss", "val/loss", "lr", "grad_norm", "perf/tokens_per_s", "perf/tokens_per_s_per_device",
           "perf/samples_per_s", "perf/step_time_s", "perf/data_wait_s", "memory/peak_gb")


def _tb(run: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _steps(points: list[tuple[int, float]]) -> list[int]:
    return [s for s, _ in points]


def test_gpt_two_ranks_trains_and_logs_every_scalar_per_optimizer_step(gpt_w2_reference):
    steps, val_every = GPT_W2_STEPS, 10
    run, stdout = gpt_w2_reference, shared_console(gpt_w2_reference)["stdout"]
    summary, tb = load_json(run / "summary.json"), _tb(run)

    assert summary["status"] == "completed" and summary["steps"] == steps
    losses = summary["losses"]
    assert len(losses) == steps and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0] - 0.5, losses  # byte-level text: ~ln 256 = 5.5 at init, falls fast

    missing = set(SCALARS) - set(tb)
    assert not missing, f"missing scalars {missing}; have {sorted(tb)}"
    # The HPARAMS tab lists loss, step time and throughput beside the plan, each a scalar the run logs.
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")["_hparams_/experiment"]
    metric_tags = {m.name.tag for m in plugin_data_pb2.HParamsPluginData.FromString(content).experiment.metric_infos}
    assert metric_tags == {"train/loss", "val/loss", "perf/step_time_s", "perf/samples_per_s", "perf/tokens_per_s"}
    assert metric_tags <= set(tb)
    for tag in set(SCALARS) - {"val/loss"}:
        assert _steps(tb[tag]) == list(range(1, steps + 1)), tag  # x = optimizer step
    assert [v for _, v in tb["train/loss"]] == pytest.approx(losses)
    val = tb["val/loss"]
    assert _steps(val) == [10, 20, 30]
    assert val[-1][1] < val[0][1] and summary["val_loss"] == pytest.approx(val[-1][1])

    # The console (piped): every validation loss when it is computed, step lines in tokens/s, and, for a run of
    # 30 steps, one table of the ranks whose marked rank is the one the sentence under it names.
    assert [line for line in stdout.splitlines() if "val loss" in line and line.startswith("  step")] == [
        f"  step {s}/{steps}  val loss {v:.4f}" for s, v in val]
    assert re.search(r"^  step 30/30  loss \d+\.\d{4}  [\d,]+ tokens/s$", stdout, re.MULTILINE), stdout
    slowest = summary["time_breakdown"]["slowest_rank"]
    marked = [line.split()[0] for line in stdout.splitlines() if line.endswith("  most work")]
    assert marked == [str(slowest)], stdout
    # the sentence names the marked rank, as an imbalance or, within a few per cent of the median, as even ranks
    assert (f"ddp-run: rank {slowest} has the most work per step" in stdout
            or f"ddp-run: the ranks' work per step is even (rank {slowest} the most" in stdout), stdout
    assert f"val loss {summary['val_loss']:.4f}" in stdout.split("ddp-run: completed:")[1].splitlines()[0]

    # Throughput arithmetic holds at every step: tokens = samples × context; per device = total / world size.
    for (_, tps), (_, per_dev), (_, sps) in zip(tb["perf/tokens_per_s"], tb["perf/tokens_per_s_per_device"],
                                                tb["perf/samples_per_s"], strict=True):
        assert tps == pytest.approx(sps * 64, rel=1e-5) and per_dev == pytest.approx(tps / 2, rel=1e-5)
    # Warmup 5 steps then cosine: LR rises to its peak 1e-3, then falls.
    lrs = [v for _, v in tb["lr"]]
    assert lrs[:5] == pytest.approx([2e-4, 4e-4, 6e-4, 8e-4, 1e-3]) and lrs[-1] < lrs[5]
    assert all(v > 0 for _, v in tb["memory/peak_gb"])

    # The step after a validation is timed without the validation (hundreds of ms here, vs ~tens per step).
    times = dict(tb["perf/step_time_s"])
    typical = float(np.median(list(times.values())))
    for s in (val_every + 1, 2 * val_every + 1):
        assert times[s] < 10 * typical, (s, times[s], typical)

    # MFU needs a known device peak: on CPU it is absent, never guessed.
    assert not any("mfu" in tag for tag in tb)
    assert summary["median"]["mfu_pct"] is None and not any("mfu" in k for k in summary["final"])
    assert summary["median"]["tokens_per_s"] > 0
    # Every window but the first (start-up) is kept, with the wall-clock span they cover.
    assert len(summary["perf_windows"]["step_time_s"]) == steps - 1
    start, end = summary["perf_span_unix"]
    assert 0 < end - start < sum(summary["perf_windows"]["step_time_s"]) + 60
    # GPU telemetry needs NVML and a GPU: on CPU there is none, and no gpu scalars either.
    assert summary["gpus"] == {} and not any(tag.startswith("gpu") for tag in tb)


def test_x_axis_is_the_optimizer_step_under_accumulation(gpt_w2_reference):
    # The shared run accumulates 2 micro-steps per optimizer step (4 per rank × 2 ranks × 2 = 16).
    steps, run = GPT_W2_STEPS, gpt_w2_reference
    summary, tb = load_json(run / "summary.json"), _tb(run)
    assert load_json(run / "run.json")["plan"]["accumulation"] == 2
    assert summary["global_batch"] == 16 and summary["steps"] == steps
    for tag in set(SCALARS) - {"val/loss"}:
        assert _steps(tb[tag]) == list(range(1, steps + 1)), tag
    assert _steps(tb["val/loss"]) == [10, 20, 30]


def test_bf16_autocast_runs_on_cpu(gpt_bin_bf16_run):
    run = gpt_bin_bf16_run
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["precision"] == "bf16"
    summary = load_json(run / "summary.json")
    assert summary["status"] == "completed" and summary["steps"] == GPT_BIN_STEPS
    assert all(math.isfinite(v) for v in summary["losses"]) and math.isfinite(summary["val_loss"])
    assert summary["losses"][-1] < summary["losses"][0]


def test_trains_from_a_local_uint16_bin(gpt_bin_bf16_run):
    # Ids above 255 prove the file is read as uint16, not bytes. A fixed cycle: the next token is predictable.
    vocab, run = GPT_BIN_VOCAB, gpt_bin_bf16_run
    summary = load_json(run / "summary.json")
    assert summary["status"] == "completed" and summary["steps"] == GPT_BIN_STEPS
    losses = summary["losses"]
    assert losses[0] == pytest.approx(math.log(vocab), abs=0.3)  # uniform over the vocabulary at init
    assert losses[-1] < losses[0] - 0.5, losses
    assert summary["val_loss"] < losses[0]
