"""What the hang watchdog's progress heartbeat costs a training step.

Two measurements:

- ``--micro``: the training loop's side in isolation: the ns per ``heartbeat.phase``/``heartbeat.step`` call
  with the writer thread running, and the calls per optimizer step (3 per micro-step + 2), against a step time
  (``--step-ms``, default 100 ms, about GPT-2 small's on 2×H200).
- default: the whole thing on real runs, interleaved: ``ddp-run <args> watchdog.timeout_s=0`` (no heartbeat, no
  writer thread, no progress files) against the same with the watchdog on, N runs each; the medians of
  ``summary.json``'s median step time. On GPUs, e.g.::

      python bench/heartbeat_cost.py --runs 3 -- task=gpt2_small world_size=2 train.max_steps=300

  The goal: at most 0.5% of the step time.

Usage: python bench/heartbeat_cost.py [--micro] [--runs 3] [--out DIR] [-- ddp-run overrides…]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def micro(step_ms: float, micro_steps: int) -> dict[str, float]:
    """ns per progress call with the writer running, and the share of a ``step_ms`` step it costs."""
    from ddp_runner.tasks.engine.diagnostics import heartbeat

    out = tempfile.mkdtemp(prefix="heartbeat-")
    for sub in ("logs/progress", "logs/stacks"):
        Path(out, sub).mkdir(parents=True)
    heartbeat.start(out, 0, 0, enabled=True)
    n = 1_000_000
    t0 = time.perf_counter()
    for i in range(n):
        heartbeat.phase("forward_backward")
        if i % 8 == 0:
            heartbeat.step(i)
    per_call_ns = (time.perf_counter() - t0) / n * 1e9
    heartbeat.stop()
    calls = 3 * micro_steps + 2
    share = calls * per_call_ns / (step_ms * 1e6)
    return {"ns_per_call": round(per_call_ns, 1), "calls_per_step": calls, "step_ms": step_ms,
            "share_of_step_pct": round(100 * share, 5)}


def median_step_s(overrides: list[str], out: str, watchdog: str) -> float:
    """One run's median step time (seconds) from its summary.json."""
    root = tempfile.mkdtemp(dir=out)
    subprocess.run([sys.executable, "-m", "ddp_runner", *overrides, f"watchdog.timeout_s={watchdog}",
                    f"output.root={root}"], check=True, stdout=subprocess.DEVNULL)
    [summary] = Path(root).rglob("summary.json")
    return float(json.loads(summary.read_text())["median"]["step_time_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--micro", action="store_true", help="only the in-process cost of the progress calls")
    ap.add_argument("--step-ms", type=float, default=100.0)
    ap.add_argument("--micro-steps", type=int, default=1, help="micro-steps per optimizer step (accumulation)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("overrides", nargs="*", help="ddp-run overrides, after --")
    a = ap.parse_args()
    if a.micro:
        print(json.dumps(micro(a.step_ms, a.micro_steps)))
        return
    out = a.out or tempfile.mkdtemp(prefix="heartbeat-cost-")
    overrides = a.overrides or ["task=smoke", "device=cpu", "world_size=2", "train.max_steps=400"]
    off, on = [], []
    for _ in range(a.runs):  # interleaved, so drift hits both alike
        off.append(median_step_s(overrides, out, "0"))
        on.append(median_step_s(overrides, out, "auto"))
    m_off, m_on = statistics.median(off), statistics.median(on)
    print("| watchdog off | watchdog on | cost |\n|---|---|---|")
    print(f"| {1e3 * m_off:.2f} ms | {1e3 * m_on:.2f} ms | {100 * (m_on / m_off - 1):+.2f}% |")
    print(json.dumps({"overrides": overrides, "off_s": off, "on_s": on, "cost_pct": 100 * (m_on / m_off - 1)}))


if __name__ == "__main__":
    main()
