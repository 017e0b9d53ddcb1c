"""What a real run's summary.json says about its series and its validation (issue 33), read from the shared tiny
GPT run of the resume tests (no launch of its own when those run in the same session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.recipes import GPT_DROPOUT_STEPS
from tests.support.run_tree import load_json


def test_summary_names_each_points_step_and_the_validations_cost(gpt_dropout_reference: Path):
    s = load_json(gpt_dropout_reference / "summary.json")
    steps = list(range(1, GPT_DROPOUT_STEPS + 1))  # train.log_every=1
    assert s["loss_steps"] == steps and s["losses_logged"] == len(s["losses"]) == GPT_DROPOUT_STEPS
    w = s["perf_windows"]
    assert w["steps"] == steps[1:] and w["count"] == len(w["step_time_s"]) == GPT_DROPOUT_STEPS - 1
    v = s["validation"]  # once, at the end; no compile, so nothing to compile
    assert v["runs"] == 1 and v["compile_mode"] == "eager" and v["graphs_compiled"] == 0
    assert v["seconds"] == pytest.approx(s["goodput"]["seconds"]["validation"], abs=0.05)
