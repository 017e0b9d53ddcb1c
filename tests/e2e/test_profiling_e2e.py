"""train.profile: the trace summary (pure, on hand-made events) and a traced CPU run through the CLI."""

from __future__ import annotations

import gzip
import json

from conftest import ddp_run, load_json, run_dirs


def _traced_run(root, max_steps: int, steps: int, start: int):
    """A tiny 2-rank gpt run on CPU with ``train.profile``; returns its run directory."""
    r = ddp_run(["task=gpt", "world_size=2", "device=cpu", f"train.max_steps={max_steps}",
                 f"train.profile.steps={steps}", f"train.profile.start={start}", "data.val_fraction=0.002"], root)
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(root)
    return run


def test_traced_steps_write_a_trace_and_a_summary_per_rank(tmp_path):
    run = _traced_run(tmp_path, max_steps=6, steps=2, start=2)
    for rank in (0, 1):
        trace = json.loads(gzip.open(run / "profile" / f"rank{rank}.trace.json.gz").read())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert any(str(n).startswith("aten::") for n in names), "the trace holds the traced steps' operators"
        summary = load_json(run / "profile" / f"rank{rank}.summary.json")
        assert summary["steps"] == 2 and summary["step_wall_ms"] > 0
    assert "profile: 2 step(s)" in (run / "logs" / "rank0.log").read_text()
    assert load_json(run / "summary.json")["steps"] == 6


def test_training_that_ends_inside_the_traced_steps_still_writes_them(tmp_path):
    run = _traced_run(tmp_path, max_steps=3, steps=5, start=1)
    assert load_json(run / "profile" / "rank0.summary.json")["steps"] == 2  # steps 2 and 3 were traced
