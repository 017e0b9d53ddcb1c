"""``batch.per_rank=auto`` from the shell: the tiny GPT on two gloo ranks with rank 1 running out of memory above 4
samples (the simulated fault) halves to 4 at step 1; stopped mid-run (SIGINT to the driver during the checkpoint at
step 10) and continued with ``resume=<run dir>`` on ranks with room for more, it keeps 4. The whole run trains exactly
as the shared run given 4 by hand (``GPT_W2``: 4 per rank × 2 ranks × 2 accumulation), bit for bit, and says what it
chose and why on the console, in summary.json, in run.json and in TensorBoard, the first launch's halving included."""

from __future__ import annotations

import signal
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddp_runner.tasks.engine.diagnostics import faults
from tests.support.driver import ddp_run
from tests.support.recipes import GPT_W2, GPT_W2_STEPS
from tests.support.run_tree import load_json, run_dirs


def _scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_an_auto_micro_batch_halves_below_the_fault_keeps_its_size_on_resume_and_trains_as_the_hand_run(
        gpt_w2_reference: Path, tmp_path: Path):
    args = [a for a in GPT_W2 if not a.startswith("batch.")] + ["batch.per_rank=auto", "batch.global=16",
                                                                "checkpoint.every_steps=10"]
    first = ddp_run(args, tmp_path, env={faults.ENV_OOM_ABOVE: "4@1", faults.ENV_STOP_AT: "checkpoint@10"})
    assert first.returncode == 128 + signal.SIGINT, first.stdout + first.stderr
    assert "batch.per_rank=auto: starting at 8 (the whole per-rank share" in first.stdout
    assert "micro-batch 8 ran out of memory at step 1 (another rank); the step runs again at 4 × 2" in first.stdout
    [run] = run_dirs(tmp_path)
    # No fault now: 8 would fit, and a resume that forgot the fitted size would train other steps.
    second = ddp_run([f"resume={run}"], tmp_path / "unused")
    assert second.returncode == 0, second.stdout + second.stderr
    auto, hand = load_json(run / "summary.json"), load_json(gpt_w2_reference / "summary.json")
    assert auto["resumed_from"] and 10 <= int(auto["resumed_from"].rsplit("_", 1)[1]) < GPT_W2_STEPS
    assert len(auto["losses"]) == GPT_W2_STEPS and auto["losses"] == hand["losses"]  # bit for bit
    assert auto["val_loss"] == hand["val_loss"]
    for tag in ("train/loss", "grad_norm"):
        assert _scalars(run, tag) == _scalars(gpt_w2_reference, tag), tag
    assert _scalars(run, "batch/micro") == [(s, 4.0) for s in range(1, GPT_W2_STEPS + 1)]
    chosen = auto["micro_batch"]
    assert (chosen["start"], chosen["chosen"], chosen["accumulation"]) == (4, 4, 2)
    assert "kept on resume" in chosen["why"]
    assert chosen["out_of_memory"] == [{"micro_batch": 8, "step": 1}], "the first launch's halving, kept"
    assert auto["explanation"] == hand["explanation"] == "global batch 16 = 4 per rank × 2 ranks × 2 accumulation"
    plan = load_json(run / "run.json")["plan"]
    assert (plan["per_rank_batch"], plan["accumulation"], plan["micro_batch"]) == (4, 2, chosen)
    assert "the resume keeps the checkpoint's micro-batch 4 × 2 accumulation" in second.stdout
