"""Early-stopping search (issue 53): the same learning-rate search of the tiny GPT, pruned and unpruned, in one run.

    python bench/prune_bench.py                      # 8 trials, 2 side by side, pruner median, on the CPU
    python bench/prune_bench.py --pruner asha --steps 100

Both searches ask the same trials in the same order (the grid sampler over ``--lrs``, one seed), 2 side by side
(``sweep.parallel=2``, one core each); about half the learning rates diverge or crawl. The unpruned search
(``hydra.sweeper.pruner=none``) runs every trial to its end. Goal: the pruned search names the same best trial in
at most 60 % of the unpruned search's optimizer steps. Prints a Markdown table and writes
``<out>/prune_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
LRS = "1e-05,0.0001,0.001,0.003,0.01,0.03,30.0,1000.0"


def search(root: Path, pruner: str, args: argparse.Namespace) -> dict[str, Any]:
    """One search into ``root``: its sweep.json, wall-clock seconds and best trial."""
    cmd = [str(BIN / "ddp-run"), "-m", "hydra/sweeper=ddp_search", "hydra.sweeper.sampler=grid",
           f"hydra.sweeper.seed={args.seed}", f"hydra.sweeper.pruner={pruner}", f"hydra.sweeper.n_trials={args.trials}",
           f"train.lr=choice({args.lrs})", "task=gpt", "device=cpu", "world_size=1", f"train.max_steps={args.steps}",
           f"train.val_every={args.val_every}", "train.val_samples=64", "sweep.parallel=2", "sweep.cores_per_rank=1",
           f"output.root={root}"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    [sweep] = list(root.glob("*/*_sweep"))
    record = json.loads((sweep / "sweep.json").read_text())
    by_job = {j["job"]: j for j in record["jobs"]}
    best = record["objective"].get("best")
    return {"command": " ".join(cmd[1:]), "wall_s": round(wall, 1), "steps": record["search"]["steps"],
            "trials": record["search"]["trials"],
            "best_lr": by_job[best]["values"]["train.lr"] if best is not None else None,
            "best_value": by_job[best]["objective"] if best is not None else None,
            "states": {j["values"]["train.lr"]: (j["status"], (j.get("figures") or {}).get("steps"))
                       for j in record["jobs"]}}


def main() -> None:
    """Run both searches, compare them, print and record the figures."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--val-every", type=int, default=10)
    p.add_argument("--lrs", default=LRS)
    p.add_argument("--pruner", default="median")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="prune-bench-"))
    full = search(out / "unpruned", "none", args)
    pruned = search(out / "pruned", args.pruner, args)
    fraction = pruned["steps"]["ran"] / full["steps"]["ran"] if full["steps"]["ran"] else None
    result = {"unpruned": full, "pruned": pruned, "steps_fraction": fraction,
              "same_best": pruned["best_lr"] == full["best_lr"],
              "goal_met": bool(fraction is not None and fraction <= 0.6 and pruned["best_lr"] == full["best_lr"])}
    (out / "prune_bench.json").write_text(json.dumps(result, indent=2))
    print("| search | optimizer steps | trials | best lr | best val_loss | wall-clock |\n|---|---|---|---|---|---|")
    for name, r in (("unpruned", full), (f"pruned ({args.pruner})", pruned)):
        print(f"| {name} | {r['steps']['ran']} | {r['trials']} | {r['best_lr']} | {r['best_value']:.4f} |"
              f" {r['wall_s']} s |")
    print(f"\npruned / unpruned steps: {fraction:.2f}; same best trial: {result['same_best']};"
          f" goal (≤ 0.60, same best) met: {result['goal_met']}")
    print(f"per trial (pruned search): {pruned['states']}")
    print(f"figures: {out / 'prune_bench.json'}")


if __name__ == "__main__":
    main()
