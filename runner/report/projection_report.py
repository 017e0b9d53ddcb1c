"""``ddp-compare --project 8,64,512``: the scaling projection's part of the report (a section of report.md,
projection.csv, projection.png): the calibration on the measured runs with the fewest ranks, the check against the
measured runs it did not use, and the table at each asked world size in both modes (fixed global batch, fixed per-rank
batch), measured figures beside projected ones. Its options: projection_options.py (ddp-compare reaches them through
this module); the arithmetic: projection.py; the model is stated in docs/scaling.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddp_runner.report import projection as P
from ddp_runner.report import projection_inputs as inputs
from ddp_runner.report.projection_inputs import RunLike
from ddp_runner.report.projection_options import add_arguments, problem, runs_problem

CSV_COLUMNS = ("group", "mode", "world", "samples_per_rank", "step_s", "work_s", "comm_s", "rate", "unit", "efficiency",
               "device_hours", "cost", "beyond_node", "feasible", "measured_rate", "error")
__all__ = ["add_arguments", "problem", "runs_problem", "section"]  # ddp-compare's entry points
LINK_FIX = "measure the link (`ddp-doctor --json > doctor.json`) and pass --links doctor.json"


# -- one group's projection ----------------------------------------------------------------------------------

@dataclass
class Projection:
    """One group's outcome: the model (None with ``failure``), the check, the projected points, the largest
    efficient N per mode, the measured runs, and the lines the report adds (skipped runs, notes)."""

    group: str
    unit: str
    gpu: bool
    measured: list[P.Measured]
    model: P.Model | None = None
    failure: str | None = None
    check: list[tuple[P.Measured, P.Point, float]] | None = None
    points: list[P.Point] | None = None
    largest: dict[str, int | None] | None = None
    notes: list[str] | None = None
    unchecked: str = ""  # why no measured run checks the projection (with an empty check)


def project_group(group: str, runs: Sequence[RunLike], args: argparse.Namespace) -> Projection:
    """Calibrate on ``runs`` of one group, check, project at ``args.project`` (both modes)."""
    usable = [r for r in runs if inputs.why_not(r) is None]
    notes = [f"{r.name} left out: {inputs.why_not(r)}" for r in runs if inputs.why_not(r) is not None]
    ms = [inputs.measured(r) for r in usable]
    unit = "tokens/s" if any(m.tokens_per_sample for m in ms) else "samples/s"
    out = Projection(group, unit, any(m.device == "cuda" for m in ms), ms, notes=notes)
    if not ms:
        out.failure = "no completed run with a median step time and a time breakdown"
        return out
    if len({m.strategy for m in ms}) > 1:
        out.failure = f"the runs use different strategies ({', '.join(sorted({m.strategy for m in ms}))})"
        return out
    worlds = sorted({m.world for m in ms})
    cal = _fit(out, runs, args)
    if out.model is None:
        return out
    out.notes += list(out.model.notes)
    out.check = P.errors(out.model, [m for m in ms if m.world not in cal])
    if not out.check:
        out.unchecked = _unchecked(runs, worlds, args.calibrate)
    asked = sorted(set(args.project) | set(worlds))
    out.points = [P.project(out.model, n, mode, args.price if out.gpu else None) for n in asked for mode in P.MODES]
    upto = max(asked)
    out.largest = {mode: P.largest_efficient(out.model, mode, upto) for mode in P.MODES}
    return out


def _fit(out: Projection, runs: Sequence[RunLike], args: argparse.Namespace) -> list[int]:
    """Calibrate ``out.model`` on the world sizes ``--calibrate`` names, else on the default split (a 1-rank fit
    only where a measured link prices the communication), and return them; on failure ``out.failure`` says why."""
    ms = out.measured
    worlds = sorted({m.world for m in ms})
    try:
        intra, inter = inputs.links(runs, args.links, args.link_gbps, args.link_latency_us, args.inter_node_gbps,
                                    args.inter_node_latency_us)
    except ValueError as exc:
        out.failure = str(exc)
        return []
    priced = intra is not None and all(m.grad_bytes for m in ms)  # what calibrate() can use (else the runs' sync)
    cal = args.calibrate or P.held_out_split(worlds, priced)[0]
    if missing := sorted(set(cal) - set(worlds)):
        out.failure = f"--calibrate names world sizes no run of this group measured: {', '.join(map(str, missing))}"
        return cal
    try:
        rpn = args.ranks_per_node or inputs.default_ranks_per_node(runs)
        out.model = P.calibrate([m for m in ms if m.world in cal], intra, inter, rpn)
    except P.Unpriced:
        out.failure = _unpriced(runs, ms, cal, args.calibrate is not None)
    except ValueError as exc:
        out.failure = str(exc)
    return cal


def _ranks(worlds: Sequence[int]) -> str:
    return " and ".join(map(str, worlds)) + f" rank{'s' if list(worlds) != [1] else ''}"


def _left_out(runs: Sequence[RunLike], worlds: Sequence[int], least: int = 1) -> list[RunLike]:
    """The runs of ``least`` or more ranks, of world sizes not in ``worlds``, that were left out (a sweep's failed
    larger run)."""
    return [r for r in runs if inputs.why_not(r) is not None and r.world not in worlds and r.world >= least]


def _named(lost: Sequence[RunLike]) -> str:
    return "; ".join(f"{r.name}, {_ranks([r.world])}: {inputs.why_not(r)}" for r in lost)


def _unpriced(runs: Sequence[RunLike], ms: Sequence[P.Measured], cal: Sequence[int], chosen: bool) -> str:
    """Why a fit cannot price communication, in the terms of what the user gave: the fix is what is missing."""
    synced = sorted({m.world for m in ms if m.world > 1})
    lost = _left_out(runs, [m.world for m in ms], least=2)
    head = "nothing says what communication costs: no link was measured, and "
    if chosen and synced and not set(cal) & set(synced):
        more = ",".join(map(str, [*cal, synced[0]]))
        return (f"{head}--calibrate {','.join(map(str, cal))} fits no run of 2 or more ranks (the measured runs of "
                f"{_ranks(synced)} are left out of it). Fix: fit one of them too (e.g. --calibrate {more}), or "
                f"{LINK_FIX}")
    if synced:
        return (f"{head}the runs of {_ranks(synced)} recorded no exposed gradient sync in their time breakdown. "
                f"Fix: {LINK_FIX}")
    if lost:
        return (f"{head}no run of 2 or more ranks completed with a time breakdown ({_named(lost)}). Fix: rerun "
                f"{'one of them' if len(lost) > 1 else 'it'}, or {LINK_FIX}")
    return f"{head}only 1-rank runs were measured. Fix: measure 2 ranks too, or {LINK_FIX}"


def _unchecked(runs: Sequence[RunLike], worlds: Sequence[int], chosen: Sequence[int] | None) -> str:
    """Why no measured run checks the projection, and what would (never what was given)."""
    lost = _left_out(runs, worlds)
    also = f" ({_named(lost)})" if lost else ""
    if chosen:
        return (f"No measured run was left out of the fit (--calibrate {','.join(map(str, chosen))}), so the "
                "projection's error is not measured here: fit on fewer world sizes to see it.")
    if len(worlds) == 1:
        return (f"Only {_ranks(worlds)} measured{also}: the projection's error needs a second world size to check "
                "it against.")
    third = (f"rerun {_ranks(sorted({r.world for r in lost}))}" if lost else
             f"measure e.g. {2 * worlds[-1]} ranks too")
    return (f"Fitted to every measured world size ({_ranks(worlds)}): no link was measured, so the fit needs the "
            f"runs of 2 or more ranks to price the communication, and none is left to check it{also}. The "
            f"projection's error needs a third world size ({third}: the smaller half of the world sizes is fitted "
            "and the rest checked), or a measured link (--links: then 1 rank fits and the others check).")


# -- words, CSV, plot ----------------------------------------------------------------------------------------

def _ms(s: float) -> str:
    return f"{1000 * s:.1f} ms"


def _rate(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _calibration_line(p: Projection) -> str:
    m = p.model
    assert m is not None
    base = m.base
    names = ", ".join(x.name for x in p.measured if x.world in m.calibrated_on)
    link = m.links.intra
    kappa = (f"; ranks share the host's {base.cores} CPU cores ({base.threads_per_rank} thread"
             f"{'s' if base.threads_per_rank != 1 else ''} a rank): κ(N) = max(1, N·threads/cores) on each host of "
             f"{m.links.ranks_per_node} ranks" if base.device == "cpu" and base.cores else "")
    ranks = " and ".join(map(str, m.calibrated_on))
    return (f"Fitted to the runs with {ranks} rank{'s' if m.calibrated_on != (1,) else ''} ({names}): "
            f"{_per_sample(m)} of data and compute per sample, optimizer {_ms(m.optimizer_s)} a step, exposure "
            f"ρ = {m.exposure:.2f} of the modelled communication; link: α {1e6 * link.latency_s:.0f} µs a hop, busbw "
            f"{link.bus_gbps:.3g} GB/s ({link.source}){kappa}; the {base.strategy} strategy, global batch "
            f"{base.global_batch}, micro-batch {base.micro_batch}. Model and assumptions: docs/scaling.md.")


def _per_sample(m: P.Model) -> str:
    if m.single_sample_s is None or m.calibrated_on == (1,) or abs(m.single_sample_s / m.sample_s - 1) < 0.01:
        return _ms(m.sample_s)
    return f"{_ms(m.single_sample_s)} (one rank, no DDP wrapper) and {_ms(m.sample_s)} (2 or more ranks)"


def _check_lines(p: Projection) -> list[str]:
    if not p.check:
        return [p.unchecked, ""]
    lines = [f"Check against the measured runs not used in the fit (goal: within {100 * P.CHECK_GOAL:.0f}%):", "",
             f"| ranks | run | measured {p.unit} | projected {p.unit} | error | measured step | projected step "
             "(work + communication) | run's own spread |", "|---|---|---|---|---|---|---|---|"]
    for m, pt, err in p.check:
        spread = m.spread
        lines.append(f"| {m.world} | {m.name} | {_rate(_measured_rate(m))} | {_rate(pt.rate)} | {100 * err:+.1f}% |"
                     f" {_ms(m.step_s)} | {_ms(pt.step_s)} ({_ms(pt.work_s)} + {_ms(pt.comm_s)}) |"
                     f" {'±%.0f%%' % (100 * spread) if spread is not None else '—'} |")
    worst = max(p.check, key=lambda c: abs(c[2]))
    verdict = (f"All within {100 * P.CHECK_GOAL:.0f}% (worst {100 * worst[2]:+.1f}% at {worst[0].world} ranks)."
               if abs(worst[2]) <= P.CHECK_GOAL else
               f"Goal missed: {100 * worst[2]:+.1f}% at {worst[0].world} ranks. " + _why(p))
    return [*lines, "", verdict, ""]


def _why(p: Projection) -> str:
    """What the report can say about a missed goal from the runs' own figures."""
    assert p.model is not None and p.check is not None
    why = []
    shared = [m for m, _, _ in p.check if P.contention(min(m.world, m.ranks_per_node or m.world), m.device, m.cores,
                                                       m.threads_per_rank) > 1]
    if shared:
        why.append(f"the runs with {', '.join(str(m.world) for m in shared)} ranks had more ranks than the host's "
                   f"{shared[0].cores} cores, so their speed also depends on what else the host ran (κ assumes they "
                   "had the cores to themselves)")
    noisy = {m.world: m.spread for m in p.measured if m.spread is not None and m.spread >= P.CHECK_GOAL}
    if noisy:
        why.append("the runs' own logging windows vary by " + ", ".join(
            f"±{100 * s:.0f}% ({w} rank{'s' if w != 1 else ''})" for w, s in sorted(noisy.items()))
            + ": a projection cannot be closer than the measurements it is fitted to and checked against")
    return ("Why: " + "; ".join(why) + ".") if why else "The runs' figures do not say why: see docs/scaling.md."


def _table_lines(p: Projection, price: float) -> list[str]:
    """The table: a row per projected world size; a measured one gets a row of what its run measured (in the
    mode whose batch it ran at) and, under it, the projection's row for it."""
    hours = "GPU-hours" if p.gpu else "rank-hours"
    cols = ["step", p.unit, "efficiency", hours] + (["cost"] if p.gpu else [])
    head = ["ranks"] + [f"{c} ({'global' if mode == P.FIXED_GLOBAL else 'per rank'})" for mode in P.MODES
                        for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by = {(pt.world, pt.mode): pt for pt in p.points or []}
    for n in sorted({pt.world for pt in p.points or []}):
        mark = " †" if by[(n, P.FIXED_GLOBAL)].beyond_node else ""
        runs = sorted((m for m in p.measured if m.world == n), key=lambda m: m.name)
        for m in runs:
            pts = {mode: _measured_point(p, m, mode, price) for mode in P.measured_modes(_model(p), m)}
            lines.append(_row(f"{n} measured{mark}", [pts.get(mode) for mode in P.MODES], len(cols), p.gpu))
        label = f"{n} projected{mark}" if runs else f"{n}{mark}"
        lines.append(_row(label, [by[(n, mode)] for mode in P.MODES], len(cols), p.gpu))
    return lines


def _model(p: Projection) -> P.Model:
    assert p.model is not None
    return p.model


def _measured_point(p: Projection, m: P.Measured, mode: str, price: float) -> P.Point:
    """``m``'s own figures in ``mode``, its efficiency against a measured 1-rank run at the batch ``mode`` keeps."""
    batch = m.global_batch if mode == P.FIXED_GLOBAL else m.samples_per_rank
    ones = [o.step_s for o in p.measured if o.world == 1 and math.isclose(o.global_batch, batch)]
    return P.measured_point(_model(p), m, mode, min(ones) if ones else None, price if p.gpu else None)


def _row(label: str, pts: Sequence[P.Point | None], ncols: int, gpu: bool) -> str:
    """One table row: per mode, its point's cells, or — where there is none (a batch the run did not run at, or
    fewer samples than ranks)."""
    cells = [label]
    for pt in pts:
        if pt is None or not pt.feasible:
            cells += ["—"] * ncols
            continue
        cells += [_ms(pt.step_s), _rate(pt.rate),
                  f"{100 * pt.efficiency:.1f}%" if math.isfinite(pt.efficiency) else "—",
                  f"{pt.device_hours:.4g}" if pt.device_hours is not None else "—"]
        if gpu:
            cells.append(f"${pt.cost:,.2f}" if pt.cost is not None else "—")
    return "| " + " | ".join(cells) + " |"


def _footer(p: Projection, price: float) -> list[str]:
    m = p.model
    assert m is not None and p.largest is not None
    upto = max(pt.world for pt in p.points or [])
    best = "; ".join(f"{mode}: {n if n else 'none (already below at 2 ranks)'}" for mode, n in p.largest.items())
    out = [f"Largest N (up to {upto}) at which the projected scaling efficiency stays at or above "
           f"{100 * P.EFFICIENCY_GOAL:.0f}%: {best}.",
           f"Efficiency: at a fixed global batch ({m.base.global_batch}), one rank's step time over N × N ranks' "
           f"(strong scaling); at a fixed per-rank batch ({m.base.samples_per_rank:g} samples a rank and step), one "
           f"rank's step time over N ranks' (weak scaling). Hours: of one run of the base run's samples "
           f"({m.base.steps} steps × {m.base.global_batch})"
           + (f"; cost at ${price:.2f} per GPU-hour." if p.gpu else "; CPU runs have no GPU cost.")
           + " A row \"measured\" is what that run measured (its efficiency against a measured 1-rank run), the row "
           "\"projected\" under it the model's figures for it; a cell of —: fewer samples than ranks at a fixed "
           "global batch, or a batch the measured run did not run at."]
    if any(pt.beyond_node for pt in p.points or []):
        out.append(f"† beyond one node of {m.links.ranks_per_node} ranks: priced on "
                   + (f"the inter-node link ({m.links.inter.bus_gbps:g} GB/s, {m.links.inter.source})"
                      if m.links.inter else "the node's own link, since no --inter-node-gbps was given: optimistic"))
    return out


def markdown(projections: Sequence[Projection], price: float) -> str:
    """The report's section: per group, the fit, the check, the projection and the notes."""
    out = ["", "# Scaling projection", ""]
    for p in projections:
        if len(projections) > 1:
            out += [f"## {p.group}", ""]
        if p.model is None:
            out += [f"No projection: {p.failure}.", ""] + [f"- {n}" for n in p.notes or []] + [""]
            continue
        out += [_calibration_line(p), ""] + _check_lines(p)
        out += _table_lines(p, price) + [""] + _footer(p, price) + [""]
        out += [f"- {n}" for n in p.notes or []] + ([""] if p.notes else [])
    return "\n".join(out)


def write_csv(projections: Sequence[Projection], path: Path) -> None:
    """Every projected point (and the check's errors on the points of measured runs) as CSV."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS)
    w.writeheader()
    for p in projections:
        checked = {m.world: (_measured_rate(m), err) for m, _, err in p.check or []}
        for pt in p.points or []:
            rate, err = checked.get(pt.world, (None, None)) if pt.mode == P.FIXED_GLOBAL else (None, None)
            w.writerow({"group": p.group, "mode": pt.mode, "world": pt.world, "samples_per_rank": pt.samples_per_rank,
                        "step_s": pt.step_s, "work_s": pt.work_s, "comm_s": pt.comm_s, "rate": pt.rate,
                        "unit": p.unit, "efficiency": pt.efficiency, "device_hours": pt.device_hours,
                        "cost": pt.cost, "beyond_node": pt.beyond_node, "feasible": pt.feasible,
                        "measured_rate": rate, "error": err})
    path.write_text(buf.getvalue())


def _grid(upto: int) -> list[int]:
    """World sizes to draw a curve through: every one up to 32, then four a doubling, up to ``upto``."""
    quarter_doublings = {round(2 ** (k / 4)) for k in range(int(4 * math.log2(max(upto, 1))) + 1)}
    return sorted({n for n in (*range(1, min(upto, 32) + 1), *quarter_doublings, upto) if n <= upto})


def _curves(p: Projection) -> dict[str, list[P.Point]]:
    assert p.model is not None
    grid = _grid(max(pt.world for pt in p.points or [P.project(p.model, 1)]))
    return {mode: [pt for n in grid if (pt := P.project(p.model, n, mode)).feasible] for mode in P.MODES}


def plot(projections: Sequence[Projection], path: Path) -> None:
    """projection.png: per group, throughput against ranks (measured points: filled where fitted, hollow where
    checked; the projected curves of both modes; the ideal line) and the projected scaling efficiency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [p for p in projections if p.model is not None]
    fig, axes = plt.subplots(len(done), 2, figsize=(11, 4 * len(done)), squeeze=False)
    for (ax, ax_eff), p in zip(axes, done, strict=True):
        curves = _curves(p)
        _throughput_panel(ax, p, curves)
        for (mode, pts), style in zip(curves.items(), ("-", "--"), strict=True):
            ax_eff.plot([pt.world for pt in pts], [100 * pt.efficiency for pt in pts], style,
                        label=f"projected, {mode}")
        ax_eff.axhline(100 * P.EFFICIENCY_GOAL, color="grey", linestyle=":", label=f"{100 * P.EFFICIENCY_GOAL:.0f}%")
        ax_eff.set_ylabel("scaling efficiency (%)")
        ax_eff.set_title("Projected scaling efficiency" + (f": {p.group}" if len(done) > 1 else ""))
        wide = max(pt.world for pt in p.points or [P.project(p.model, 1)]) > 16
        for a in (ax, ax_eff):
            a.set_xlabel("ranks (world size)")
            if wide:  # powers of two apart: a log axis, throughput on one too
                a.set_xscale("log", base=2)
            a.legend(fontsize="small")
        if wide:
            ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _throughput_panel(ax: Any, p: Projection, curves: Mapping[str, Sequence[P.Point]]) -> None:
    assert p.model is not None
    for (mode, pts), style in zip(curves.items(), ("-", "--"), strict=True):
        ax.plot([pt.world for pt in pts], [pt.rate for pt in pts], style, label=f"projected, {mode}")
    one = P.project(p.model, 1, P.FIXED_GLOBAL).rate
    worlds = [pt.world for pt in curves[P.FIXED_PER_RANK]]
    ax.plot(worlds, [one * n for n in worlds], ":", color="grey", label="ideal (one rank × N)")
    fitted = [m for m in p.measured if m.world in p.model.calibrated_on]
    checked = [m for m in p.measured if m.world not in p.model.calibrated_on]
    for ms, face, label in ((fitted, "C3", "measured, fitted"), (checked, "none", "measured, checked")):
        if ms:
            ax.scatter([m.world for m in ms], [_measured_rate(m) for m in ms], facecolors=face, edgecolors="C3",
                       zorder=3, label=label)
    ax.set_ylabel(p.unit)
    ax.set_title("Throughput: measured and projected")


def _measured_rate(m: P.Measured) -> float:
    return m.global_batch * (m.tokens_per_sample or 1) / m.step_s


def section(groups: Mapping[str, Sequence[RunLike]], args: argparse.Namespace, out: Path) -> tuple[str, list[Path]]:
    """The report's projection section and the files it wrote (projection.csv, projection.png), or ("", []) without
    ``--project``. ``groups``: ddp-compare's groups of runs that compare."""
    if args.project is None:
        return "", []
    projections = [project_group(g, members, args) for g, members in groups.items()]
    write_csv(projections, out / "projection.csv")
    files = [out / "projection.csv"]
    if any(p.model is not None for p in projections):
        plot(projections, out / "projection.png")
        files.append(out / "projection.png")
    return markdown(projections, args.price), files
