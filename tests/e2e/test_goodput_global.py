"""summary.json's goodput (tasks/engine/reporting/summary.py, tasks/engine/reporting/metrics.py) counts the whole job,
every rank: on a 2-rank run, samples/s × wall seconds is the steps × the GLOBAL batch, and tokens/s × wall seconds
that many samples' tokens. A per-rank figure (half of it) must fail. One real 2-rank gloo launch of the tiny GPT,
shared with test_gpt.py and test_profiling_e2e.py (tests/e2e/conftest.py: ``gpt_w2_reference``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.recipes import GPT_W2_STEPS
from tests.support.run_tree import load_json
from tests.support.shared_runs import shared_console

# 4 per rank × 2 ranks × 2 accumulation = 16 samples per optimizer step; a per-rank count would be 8.
GLOBAL_BATCH = 16
TOLERANCE = 0.1  # the figures are computed from the same clock: far tighter than the factor 2 being guarded


@pytest.fixture
def gpt_w2(gpt_w2_reference: Path) -> dict[str, Any]:
    """The launch: its console, summary, plan, tokens per sample, and how long it took seen from outside."""
    run = gpt_w2_reference
    console = shared_console(run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    return {"stdout": console["stdout"], "summary": load_json(run / "summary.json"),
            "plan": load_json(run / "run.json")["plan"], "tokens_per_sample": int(config["task"]["model"]["context"]),
            "outside_s": console["outside_s"], "run": run}


def test_goodput_samples_per_s_is_global_on_two_ranks(gpt_w2: dict[str, Any]) -> None:
    """samples/s × wall seconds = steps × global batch (16), not steps × the per-rank share (8)."""
    plan, summary = gpt_w2["plan"], gpt_w2["summary"]
    assert (plan["world_size"], plan["global_batch"], summary["global_batch"]) == (2, GLOBAL_BATCH, GLOBAL_BATCH)
    g = summary["goodput"]
    assert 0 < g["wall_s"] <= gpt_w2["outside_s"]  # the driver's start to the end of training, within the launch
    samples = summary["steps"] * GLOBAL_BATCH
    assert summary["steps"] == GPT_W2_STEPS
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
