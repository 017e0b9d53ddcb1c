"""``batch.per_rank=auto`` from the shell: the tiny GPT on two gloo ranks with rank 1 running out of memory above 4
samples (the simulated fault) trains exactly as the shared run given 4 by hand (``GPT_W2``: 4 per rank × 2 ranks ×
2 accumulation), bit for bit, and says what it chose and why on the console, in summary.json and in run.json."""

from __future__ import annotations

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


def test_an_auto_micro_batch_halves_below_the_fault_and_trains_as_the_hand_run(gpt_w2_reference: Path,
                                                                               tmp_path: Path):
    args = [a for a in GPT_W2 if not a.startswith("batch.")] + ["batch.per_rank=auto", "batch.global=16"]
    r = ddp_run(args, tmp_path, env={faults.ENV_OOM_ABOVE: "4@1"})
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(tmp_path)
    auto, hand = load_json(run / "summary.json"), load_json(gpt_w2_reference / "summary.json")
    assert len(auto["losses"]) == GPT_W2_STEPS and auto["losses"] == hand["losses"]  # bit for bit
    assert auto["val_loss"] == hand["val_loss"]
    for tag in ("train/loss", "grad_norm"):
        assert _scalars(run, tag) == _scalars(gpt_w2_reference, tag), tag
    chosen = auto["micro_batch"]
    assert (chosen["start"], chosen["chosen"], chosen["accumulation"]) == (8, 4, 2)
    assert chosen["out_of_memory"] == [{"micro_batch": 8, "step": 1}] and "halved after" in chosen["why"]
    assert auto["explanation"] == hand["explanation"] == "global batch 16 = 4 per rank × 2 ranks × 2 accumulation"
    plan = load_json(run / "run.json")["plan"]
    assert (plan["per_rank_batch"], plan["accumulation"], plan["micro_batch"]) == (4, 2, chosen)
    assert "batch.per_rank=auto: starting at 8 (the whole per-rank share" in r.stdout
    assert "micro-batch 8 ran out of memory at step 1 (another rank); the step runs again at 4 × 2" in r.stdout
