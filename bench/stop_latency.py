"""What a stop costs: the time from the signal to a committed checkpoint, and what the per-step stop vote (one MAX
all-reduce of a 1-element tensor, tasks/engine/stop/vote.py) costs a training step.

Three measurements, one JSON line at the end:

- ``stop``: ``ddp-run <preset> …``, SIGINT to the driver once its console has printed step ``--stop-at``; the
  seconds from the signal to the checkpoint's commit marker (``meta.json``'s mtime), to the driver's exit, the
  step the ranks stopped after and the save's own time (``logs/rank0.json`` ``stopped.save_s``). ``--stops`` runs.
- ``vote``: on a log step the vote rides in the gather of the logged values (``folded_votes``); on the other steps
  it is an all-reduce of its own (``standalone_votes``), whose mean host time on rank 0 (``summary.json``
  ``stop_vote.mean_us``) is set against the median step time of the same run: its share of a step. Pass
  ``-- train.log_every=10`` to measure the standalone vote.
- ``ab``: step time with the vote on and off (``checkpoint.on_stop``), interleaved runs, the medians of
  ``summary.json``'s median step time (noisy on a shared CPU; the ``vote`` figure is the direct one).

Presets: ``tiny`` (the tiny GPT on CPU, 2 gloo ranks), ``gpt2_small`` (GPT-2 small, one GPU, bf16). Anything after
``--`` is passed on to ddp-run. Examples::

    python bench/stop_latency.py --preset tiny
    python bench/stop_latency.py --preset gpt2_small --steps 300 --stop-at 100
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESETS = {
    "tiny": ["task=gpt", "device=cpu", "world_size=2", "batch.per_rank=4", "train.log_every=1"],
    "gpt2_small": ["task=gpt2_small", "device=cuda", "world_size=1", "train.precision=bf16", "train.compile=true",
                   "train.log_every=10"],
}


def launch(args: list[str], root: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ddp_runner", *args, f"output.root={root}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_dir(root: str) -> Path:
    [manifest] = Path(root).rglob("run.json")
    return manifest.parent


def one_stop(args: list[str], stop_at: int, out: str) -> dict[str, float]:
    """SIGINT to the driver after step ``stop_at``: signal → committed checkpoint, signal → driver exit."""
    root = tempfile.mkdtemp(dir=out)
    proc = launch(args, root)
    assert proc.stdout is not None
    for line in proc.stdout:
        if re.match(rf"\s*step {stop_at}/", line):
            break
    else:
        raise SystemExit(f"the run ended before step {stop_at}: {proc.stderr.read() if proc.stderr else ''}")
    t_signal = time.time()
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=300)
    t_exit = time.time()
    run = run_dir(root)
    stopped = json.loads((run / "logs/rank0.json").read_text()).get("stopped")
    if stopped is None:  # no stop was taken: say what the run did instead
        log = (run / "logs/rank0.log").read_text()[-3000:]
        raise SystemExit(f"no stop recorded (exit {proc.returncode}) in {run}\n--- stdout\n{rest[-2000:]}\n"
                         f"--- stderr\n{err[-3000:]}\n--- rank0.log\n{log}")
    marker = run / "checkpoints" / stopped["checkpoint"] / "meta.json"
    return {"signal_to_commit_s": round(os.path.getmtime(marker) - t_signal, 3),
            "signal_to_exit_s": round(t_exit - t_signal, 3), "stopped_after_step": stopped["step"],
            "signalled_after_step": stop_at, "save_s": stopped["save_s"], "exit_code": proc.returncode}


def one_run(args: list[str], on_stop: bool, out: str) -> dict[str, float | None]:
    """A whole run: its median step time and (vote on) the vote's mean host time per step on rank 0."""
    root = tempfile.mkdtemp(dir=out)
    subprocess.run([sys.executable, "-m", "ddp_runner", *args, f"checkpoint.on_stop={str(on_stop).lower()}",
                    f"output.root={root}"], check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((run_dir(root) / "summary.json").read_text())
    vote = summary.get("stop_vote") or {}
    return {"step_s": float(summary["median"]["step_time_s"]), "vote_us": vote.get("mean_us"),
            "polls": vote.get("polls"), "folded": vote.get("folded")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps of the step-time runs")
    p.add_argument("--stop-at", type=int, default=20, help="the step after which SIGINT is sent")
    p.add_argument("--stops", type=int, default=2, help="stop runs")
    p.add_argument("--runs", type=int, default=2, help="step-time runs with the vote on, and as many off")
    p.add_argument("--out", default=None, help="where the runs go (default: a temporary folder)")
    p.add_argument("extra", nargs="*", help="ddp-run overrides after --")
    a = p.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="stop-latency-")
    os.makedirs(out, exist_ok=True)
    given = {o.split("=", 1)[0] for o in a.extra}  # an override of a preset's key replaces it
    base = [*(o for o in PRESETS[a.preset] if o.split("=", 1)[0] not in given), *a.extra]
    stops = [one_stop([*base, f"train.max_steps={10 * a.stop_at}"], a.stop_at, out) for _ in range(a.stops)]
    on, off = [], []
    for _ in range(a.runs):  # interleaved: drift on a shared machine hits both alike
        on.append(one_run([*base, f"train.max_steps={a.steps}"], True, out))
        off.append(one_run([*base, f"train.max_steps={a.steps}"], False, out))
    step_on = statistics.median(r["step_s"] for r in on)
    step_off = statistics.median(r["step_s"] for r in off)
    timed = [r["vote_us"] for r in on if r["vote_us"] is not None]
    vote_us = statistics.median(timed) if timed else None  # None: every vote rode in the log step's gather
    result = {
        "preset": a.preset, "extra": a.extra, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "stops": stops,
        "signal_to_commit_s_median": statistics.median(s["signal_to_commit_s"] for s in stops),
        "standalone_votes": on[0]["polls"], "folded_votes": on[0]["folded"],
        "vote_us_per_standalone_vote": None if vote_us is None else round(vote_us, 1),
        "step_ms_vote_on": round(1e3 * step_on, 3),
        "vote_share_of_step_pct": None if vote_us is None else round(100 * vote_us * 1e-6 / step_on, 4),
        "step_ms_vote_off": round(1e3 * step_off, 3),
        "ab_difference_pct": round(100 * (step_on - step_off) / step_off, 2),
        "step_ms_runs_on": [round(1e3 * r["step_s"], 3) for r in on],
        "step_ms_runs_off": [round(1e3 * r["step_s"], 3) for r in off],
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
