"""``ddp-doctor``: the command line over :func:`~ddp_runner.diagnostics.doctor.report.full_report`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ddp_runner.contract import console_streams, textfit
from ddp_runner.diagnostics.doctor.checks import FAIL, parse_size
from ddp_runner.diagnostics.doctor.report import full_report, render


def _parse_sizes(text: str) -> list[int]:
    try:
        return [parse_size(s) for s in text.split(",") if s.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddp-doctor", description="Preflight checks for multi-GPU PyTorch training: "
                                "devices, topology, visible-device mapping, NCCL/gloo, /dev/shm, environment, and "
                                "a short all-reduce bus-bandwidth measurement. Exit code 1 when a check fails.")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the all-reduce measurement")
    p.add_argument("--sizes", type=_parse_sizes, default=None,
                   help="all-reduce sizes, e.g. 1M,64M,512M (default 1M…512M on GPU, 1M…64M on CPU)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where to measure: auto = NCCL when 2+ GPUs, else gloo on CPU")
    p.add_argument("--nproc", type=int, default=None, help="processes (default: every GPU, or 2 on CPU)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before the measurement counts as a hang")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``ddp-doctor``: print the report (table or ``--json``); 1 when a check fails, else 0."""
    console_streams.guard()  # a closed pipe or an ASCII console never ends it (docs/run-tree.md)
    args = _parser().parse_args(argv)
    if args.nproc is not None and args.nproc < 2:
        textfit.say("ddp-doctor: --nproc must be at least 2 (an all-reduce across one process measures nothing)",
                    sys.stderr)
        return 2
    progress = None if args.json else (lambda msg: textfit.say(f"checking {msg} …", sys.stderr, flush=True))
    report = full_report(bandwidth=not args.no_bandwidth, device=args.device, nproc=args.nproc, sizes=args.sizes,
                         timeout_s=args.timeout, progress=progress)
    print(json.dumps(report, indent=2) if args.json else render(report, textfit.terminal_width(sys.stdout)))
    return 1 if report["status"] == FAIL else 0

