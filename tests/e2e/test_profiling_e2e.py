"""train.profile through the CLI: traced CPU runs of the tiny GPT on 2 ranks (the trace summary's arithmetic on
hand-made events is pure). Both runs are shared with other files (tests/e2e/conftest.py): ``gpt_bin_bf16_run`` traces
steps 3 and 4 of 20, ``gpt_w2_reference`` asks for 5 steps after step 28 of 30."""

from __future__ import annotations

import gzip
import json

from tests.support.recipes import GPT_BIN_STEPS
from tests.support.run_tree import load_json


def test_traced_steps_write_a_trace_and_a_summary_per_rank(gpt_bin_bf16_run):
    run = gpt_bin_bf16_run  # train.profile.steps=2, train.profile.start=2
    for rank in (0, 1):
        trace = json.loads(gzip.open(run / "profile" / f"rank{rank}.trace.json.gz").read())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert any(str(n).startswith("aten::") for n in names), "the trace holds the traced steps' operators"
        summary = load_json(run / "profile" / f"rank{rank}.summary.json")
        assert summary["steps"] == 2 and summary["step_wall_ms"] > 0
    assert "profile: 2 step(s)" in (run / "logs" / "rank0.log").read_text()
    assert load_json(run / "summary.json")["steps"] == GPT_BIN_STEPS


def test_training_that_ends_inside_the_traced_steps_still_writes_them(gpt_w2_reference):
    run = gpt_w2_reference  # train.profile.steps=5 after step 28 of 30
    assert load_json(run / "profile" / "rank0.summary.json")["steps"] == 2  # steps 29 and 30 were traced
