"""``ddp-compare --project``'s options: declared, parsed and checked before any figure is computed. A wrong value is
refused (exit 2) with a line naming the option, the value and the fix, as ddp-compare refuses its other options;
the projection itself (projection_report.py) then only meets values it can use."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddp_runner.report import projection_inputs as inputs
from ddp_runner.report.projection_inputs import RunLike

DOCTOR_FIX = "write it with `ddp-doctor --json > doctor.json` and pass --links doctor.json"


def refusal(option: str, value: object, problem: str, fix: str) -> str:
    """One refusal line: ``--option=value: problem. Fix: fix`` (the house's style, contract/errors.py's PlanError)."""
    return f"{option}={value}: {problem}. Fix: {fix}"


def world_list(text: str) -> list[int]:
    """``"8,64,512"`` → [8, 64, 512] (argparse type: positive integers, comma-separated; an empty one between two
    commas is a typo, not a world size to skip)."""
    words = [t.strip() for t in text.split(",")]

    def wrong(why: str) -> argparse.ArgumentTypeError:  # argparse prefixes the option: "argument --project: "
        return argparse.ArgumentTypeError(f"{text}: {why}. Fix: world sizes of 1 or more separated by single "
                                          "commas, e.g. 8,64,512")

    if "" in words:
        raise wrong("an empty world size between commas" if len(words) > 1 else "no world size")
    try:
        out = sorted({int(t) for t in words})
    except ValueError:
        raise wrong("not whole numbers") from None
    if out[0] < 1:
        raise wrong("world sizes must be 1 or more")
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The projection's options, in a group of their own."""
    g = ap.add_argument_group("scaling projection (docs/scaling.md)")
    g.add_argument("--project", type=world_list, metavar="N,N,…",
                   help="project step time, throughput, scaling efficiency and cost at these world sizes (e.g. "
                   "8,64,512) from the measured runs; the report also gives its own error on measured runs it was "
                   "not fitted to")
    g.add_argument("--calibrate", type=world_list, metavar="N,N,…",
                   help="the measured world sizes the projection is fitted to (default: the smaller half of them, "
                   "e.g. 1,2 of 1,2,3,4; the others are the check; all of 1,2 unless a link is measured)")
    g.add_argument("--links", metavar="FILE",
                   help="the all-reduce within a node as `ddp-doctor --json` measured it (that report, or a run.json "
                   "holding one); default: a run.json's, else the runs' own exposed gradient sync")
    g.add_argument("--link-gbps", type=float, help="bus bandwidth within a node, GB/s (instead of --links)")
    g.add_argument("--link-latency-us", type=float, help="latency per hop within a node, µs (with --link-gbps)")
    g.add_argument("--inter-node-gbps", type=float,
                   help="bus bandwidth between nodes per rank, GB/s (e.g. 50 for one 400 Gb/s NIC a GPU); without "
                   "it, ranks on other nodes are priced on the node's link and the report says so")
    g.add_argument("--inter-node-latency-us", type=float, help="latency per hop between nodes, µs")
    g.add_argument("--ranks-per-node", type=int,
                   help="ranks a node holds (default: 8 for GPU runs, the most ranks a measured CPU host ran)")


# option: (what it is, an example); the first three must be > 0, the latencies >= 0
_NUMBERS = {"link_gbps": ("the bus bandwidth within a node in GB/s", "25"),
            "inter_node_gbps": ("the bus bandwidth between nodes per rank in GB/s", "50"),
            "ranks_per_node": ("the ranks one node holds", "8"),
            "link_latency_us": ("the latency of one hop within a node in µs", "5"),
            "inter_node_latency_us": ("the latency of one hop between nodes in µs", "10")}
_LATENCIES = ("link_latency_us", "inter_node_latency_us")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the projection's options on their own (None: nothing), as a refusal line."""
    if args.project is None:
        given = [o for o in ("calibrate", "links", "link_gbps", "inter_node_gbps", "ranks_per_node")
                 if getattr(args, o) is not None]
        if not given:
            return None
        flag = _flag(given[0])
        return f"{flag} needs --project. Fix: add --project N,N,… (the world sizes to project), or drop {flag}"
    for name, (what, example) in _NUMBERS.items():
        v = getattr(args, name)
        zero_ok = name in _LATENCIES
        if v is not None and (not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok)):
            return refusal(_flag(name), v, f"must be {'>=' if zero_ok else '>'} 0, a finite number",
                           f"give {what}, e.g. {_flag(name)} {example}")
    if args.links:
        if not Path(args.links).is_file():
            return refusal("--links", args.links, "no such file", DOCTOR_FIX)
        try:
            inputs.links_file(Path(args.links))
        except ValueError as exc:
            return refusal("--links", args.links, str(exc), DOCTOR_FIX)
    return None


def _shown(value: object) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def runs_problem(groups: Mapping[str, Sequence[RunLike]], args: argparse.Namespace) -> str | None:
    """What is wrong with the projection's options against the runs (None: nothing): ``--calibrate`` naming a world
    size that no usable run measured, in any group (a group lacking one the others have says so in its section)."""
    if args.project is None or args.calibrate is None:
        return None
    runs = [r for members in groups.values() for r in members]
    usable = sorted({r.world for r in runs if inputs.why_not(r) is None})
    missing = [w for w in args.calibrate if w not in usable]
    if not missing:
        return None
    left = [f"{r.name} left out: {inputs.why_not(r)}" for r in runs if r.world in missing]
    said = f"no completed run with a time breakdown has {' or '.join(map(str, missing))} ranks" + (
        f" ({'; '.join(left)})" if left else "")
    fix = (f"name measured world sizes (measured: {', '.join(map(str, usable))}), or drop --calibrate for the "
           "default" if usable else "measure completed runs with train.timing_every on")
    return refusal("--calibrate", _shown(args.calibrate), said, fix)
