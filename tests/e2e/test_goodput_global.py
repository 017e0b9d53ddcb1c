"""summary.json's goodput (tasks/engine/trainer.py, tasks/engine/metrics.py) counts the whole job, every rank: on
a 2-rank run, samples/s × wall seconds is the steps × the GLOBAL batch, and tokens/s × wall seconds that many
samples' tokens. A per-rank figure (half of it) must fail. One real 2-rank gloo launch of the tiny GPT, shared."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ddp_run, load_json, run_dirs

# 4 per rank × 2 ranks × 2 accumulation = 16 samples per optimizer step; a per-rank count would be 8.
ARGS = ["task=gpt", "device=cpu", "world_size=2", "batch.per_rank=4", "batch.accumulation=2", "train.max_steps=6",
        "train.log_every=2", "train.val_samples=64"]
GLOBAL_BATCH = 16
TOLERANCE = 0.1  # the figures are computed from the same clock: far tighter than the factor 2 being guarded


@pytest.fixture(scope="module")
def gpt_w2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The launch: its console, summary, plan, tokens per sample, and how long it took seen from outside."""
    root = tmp_path_factory.mktemp("goodput") / "outputs"
    t0 = time.monotonic()
    r = ddp_run(ARGS, root)
    outside_s = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(root)
    config = yaml.safe_load((run / "config.yaml").read_text())
    return {"stdout": r.stdout, "summary": load_json(run / "summary.json"), "plan": load_json(run / "run.json")["plan"],
            "tokens_per_sample": int(config["task"]["model"]["context"]), "outside_s": outside_s, "run": Path(run)}


def test_goodput_samples_per_s_is_global_on_two_ranks(gpt_w2: dict[str, Any]) -> None:
    """samples/s × wall seconds = steps × global batch (16), not steps × the per-rank share (8)."""
    plan, summary = gpt_w2["plan"], gpt_w2["summary"]
    assert (plan["world_size"], plan["global_batch"], summary["global_batch"]) == (2, GLOBAL_BATCH, GLOBAL_BATCH)
    g = summary["goodput"]
    assert 0 < g["wall_s"] <= gpt_w2["outside_s"]  # the driver's start to the end of training, within the launch
    samples = summary["steps"] * GLOBAL_BATCH
    assert summary["steps"] == 6
    assert g["samples_per_s"] * g["wall_s"] == pytest.approx(samples, rel=TOLERANCE)


def test_goodput_tokens_per_s_is_global_on_two_ranks(gpt_w2: dict[str, Any]) -> None:
    """tokens/s × wall seconds = steps × global batch × tokens per sample; the console's goodput says the same."""
    summary = gpt_w2["summary"]
    g = summary["goodput"]
    tokens = summary["steps"] * GLOBAL_BATCH * gpt_w2["tokens_per_sample"]
    assert g["tokens_per_s"] * g["wall_s"] == pytest.approx(tokens, rel=TOLERANCE)
    m = re.search(r"goodput ([\d,]+) tokens/s", gpt_w2["stdout"])
    assert m, gpt_w2["stdout"]
    assert float(m.group(1).replace(",", "")) == pytest.approx(g["tokens_per_s"], abs=1.0)
