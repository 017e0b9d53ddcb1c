"""``ddp-compare``: a set of run directories (or sweep directories) → a table, a CSV, plots and one sentence per
run that answers "is N GPUs worth it for this job, what does it cost, and if not, why".

Only what holds is said: runs are compared within groups of one task and one throughput unit (never an efficiency
across samples/s and tokens/s, or across tasks); scaling efficiency only between runs that differ in world size;
a sweep's keys are what it compares, not a difference to warn of, and its jobs are called by their values
(``lr=0.001``); GPU-hours and cost only for runs on GPUs; every column is named in the legend under the table
(runner/report/legend.py); every sentence on where the time goes names its run.

This module is the command (its options, the order of the work, the files it writes); the work is in rooms of one
job each: compare_runs.py reads what the runs wrote (run.json, summary.json, config.yaml), compare_math.py is the
arithmetic in pure functions (efficiency, time to a target loss, cost, the bottleneck sentence, the config
difference), compare_table.py the grouping, rows, Markdown and CSV, compare_plots.py the plots.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ddp_runner.contract import console_streams, layout, textfit
from ddp_runner.report import projection_report
from ddp_runner.report.compare_math import (
    EXPECTED_DIFFERENCES,
    bottleneck,
    common_target,
    config_differences,
    cost,
    gpu_hours,
    loss_at_steps,
    scaling_efficiency,
    time_to_target,
)
from ddp_runner.report.compare_plots import plots
from ddp_runner.report.compare_runs import Run, find_runs, load_run
from ddp_runner.report.compare_table import (
    COLUMNS,
    baselines,
    groups,
    labels,
    markdown,
    metric_columns,
    rows,
    sweep_trials,
    swept_values,
    warnings,
    write_csv,
)
from ddp_runner.rundir import records

# The command's parts, named here for its users (bench/, the tests): the modules above are where each lives.
__all__ = ["COLUMNS", "DEFAULT_PRICE", "EXPECTED_DIFFERENCES", "Run", "baselines", "bottleneck", "common_target",
           "config_differences", "cost", "find_runs", "gpu_hours", "groups", "labels", "load_run", "loss_at_steps",
           "main", "markdown", "metric_columns", "plots", "rows", "scaling_efficiency", "swept_values",
           "sweep_trials", "time_to_target", "warnings", "write_csv"]

DEFAULT_PRICE = 2.50  # USD per GPU-hour: a round on-demand figure for a data-centre GPU; --price sets yours


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``ddp-compare``."""
    console_streams.guard()  # a closed pipe or an ASCII console never ends it (docs/run-tree.md)
    ap = argparse.ArgumentParser(
        prog="ddp-compare", description="Compare run directories (or sweep directories): table, CSV, plots.",
        epilog="Example: ddp-compare outputs/2026-11-30/12-00-00_sweep --target-loss 3.5 --out report")
    ap.add_argument("paths", nargs="+", help="run directories, or folders (sweeps) holding run directories")
    ap.add_argument("--out", default="compare", help="folder for report.md, report.csv and the plots")
    ap.add_argument("--target-loss", type=float, default=None,
                    help="loss to time the runs to (default: in each group of runs of one task, the loss every "
                    "completed run of it reached)")
    ap.add_argument("--price", type=float, default=DEFAULT_PRICE,
                    help=f"price per GPU-hour for the cost column of GPU runs (default {DEFAULT_PRICE:.2f})")
    projection_report.add_arguments(ap)
    args = ap.parse_args(argv)
    if wrong := projection_report.problem(args):
        textfit.say(f"ddp-compare: error: {wrong}", sys.stderr)
        return 2
    try:
        paths = find_runs(args.paths)
    except FileNotFoundError as exc:
        textfit.say(f"ddp-compare: error: {exc}. Fix: pass run directories (holding {layout.MANIFEST}) or sweep"
                    " folders", sys.stderr)
        return 2
    if not paths:
        textfit.say(f"ddp-compare: error: no run directory under {' '.join(args.paths)}", sys.stderr)
        return 2
    if args.price < 0:
        textfit.say(f"ddp-compare: error: --price={args.price}: must be >= 0", sys.stderr)
        return 2
    try:
        runs = [load_run(p) for p in paths]
    except records.DamagedFile as damaged:
        textfit.say(damaged.line("ddp-compare"), sys.stderr)
        return 2
    if wrong := projection_report.runs_problem(groups(runs), args):
        textfit.say(f"ddp-compare: error: {wrong}", sys.stderr)
        return 2
    # The loss to time the runs to: the user's, or in each group the loss every completed run of it reached.
    target = args.target_loss if args.target_loss is not None else {
        group: common_target(members) for group, members in groups(runs).items()}
    table = rows(runs, target, args.price)
    warns = warnings(runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    projected, projected_files = projection_report.section(groups(runs), args, out)  # with --project
    report = markdown(table, warns, args.price, swept_values(runs)) + sweep_trials(args.paths) + projected
    (out / "report.md").write_text(report)
    write_csv(table, out / "report.csv")
    files = plots(runs, table, out) + projected_files
    # On a terminal its prose fits (the tables stay whole: report.md is the report); piped, it is report.md.
    print("\n".join(textfit.fit_prose(report, textfit.terminal_width(sys.stdout))))
    textfit.say(f"ddp-compare: wrote {out / 'report.md'}, {out / 'report.csv'}, " + ", ".join(str(f) for f in files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
