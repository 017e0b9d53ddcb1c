"""bench/scaling_study.py, the GPU study script, dry-run on the CPU with the tiny GPT and a stand-in reference."""

from __future__ import annotations

from bench import scaling_study


def test_summary_states_the_goals_against_the_reference():
    job = {"values": {"world_size": "1"}, "status": "completed", "tok_s": 900.0, "cache_hits": 0,
           "time_breakdown": {"shares": {"data": 0.0, "compute": 0.9, "exposed_sync": 0.05, "optimizer": 0.05},
                              "gap_pct": 2.0}}
    res = {"reference": [{"world": 1, "first_step_s": 40.0, "tok_s": 1000.0, "step_s": 0.5, "rc": 0}],
           "studies": [{"scope": "blocks", "rc": 0, "wall_s": 90.0, "sweep_dir": "s",
                        "jobs": [{**job, "job": 0, "first_step_s": 30.0},
                                 {**job, "job": 1, "first_step_s": 12.0, "values": {"world_size": "2"}}]}],
           "pairs": [{"name": "d", "a": {"overrides": ["x=0"], "tok_s": 100.0}, "b": {"overrides": ["x=5"],
                                                                                       "tok_s": 99.0},
                      "b_over_a_pct": -1.0}], "wall_s": 100.0}
    text = "\n".join(scaling_study.summary_lines(res))
    assert "job 1 30.0 s vs reference w1 40.0 s: MET" in text and "job 2 12.0 s = 40% of job 1: MET" in text
    assert "w1 tokens/s against the reference: 90.0%" in text and "second/first -1.00%" in text
    assert "exposed sync 5.0%" in text


def test_the_strategy_bench_states_scaling_per_strategy_and_for_the_best():
    """bench/strategy_bench.py compares each strategy at N GPUs with itself on one GPU, and the best at N with the
    best on one; worlds without a 1-GPU run get no line."""
    from bench import strategy_bench

    rows = [{"run": "gpt2_small", "strategy": s, "world": w, "tok_s": t}
            for s, w, t in (("ddp", 1, 500.0), ("fsdp", 1, 400.0), ("ddp", 2, 960.0), ("fsdp", 2, 800.0),
                            ("ddp", 4, 1800.0))]
    rows.append({"run": "gpt_6b", "strategy": "fsdp", "world": 2, "tok_s": 10.0})
    assert strategy_bench.scaling_lines(rows) == [
        "GPT-2 small scaling 1 → 2 GPUs, best strategy ddp against the best on 1 GPU: 96.0%"
        " (each against itself: ddp 96.0%, fsdp 100.0%)",
        "GPT-2 small scaling 1 → 4 GPUs, best strategy ddp against the best on 1 GPU: 90.0%"
        " (each against itself: ddp 90.0%)"]
    assert strategy_bench.scaling_lines([r for r in rows if r["world"] != 1]) == []
