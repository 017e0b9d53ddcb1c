"""What the scaling projection reads: each run directory's measured figures as a
:class:`~ddp_runner.report.projection.Measured` (summary.json's median step time, time breakdown and scaling facts,
config.yaml's batch and strategy, run.json's plan, a rank's cores), and the links (a ``ddp-doctor --json`` report,
a run.json's doctor report, or figures given on the command line)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ddp_runner.contract import layout, scaling
from ddp_runner.contract.rules import get
from ddp_runner.report.projection import Link, Measured, fit_link
from ddp_runner.rundir import records


class RunLike(Protocol):
    """The parts of ddp-compare's ``Run`` read here (compare imports this module, so not the class itself)."""

    path: Path
    name: str
    status: str
    world: int
    device: str
    global_batch: int | None
    config: dict[str, Any]
    steps: int
    step_time_s: float | None
    tokens_per_sample: int | None
    time_breakdown: dict[str, Any] | None


def _json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path`` (through the run tree's one reader, runner/rundir/records.py), or {} when it is
    missing or damaged (the projection then goes without it)."""
    try:
        return records.read_url(str(path), records.fix_for(path.name, str(path.parent))) or {}
    except records.DamagedFile:
        return {}


def why_not(run: RunLike) -> str | None:
    """Why ``run`` cannot calibrate a projection (None: it can)."""
    if run.status != layout.STATUS_COMPLETED:
        return f"{run.status}, not completed"
    if not run.step_time_s or not run.global_batch or not run.world:
        return "no median step time"
    tb = run.time_breakdown or {}
    if not tb.get("per_rank") or not tb.get("shares"):
        return "no time breakdown (train.timing_every=0)"
    return None


def measured(run: RunLike) -> Measured:
    """``run`` as numbers (call :func:`why_not` first). The shares are the slowest rank's, as summary.json's
    time_breakdown gives them; cores from the scaling facts, else from rank 0's CPU affinity (logs/rank0.json)."""
    tb = run.time_breakdown or {}
    shares = tb["shares"]
    summary = _json(run.path / layout.SUMMARY)
    facts = summary.get(scaling.SUMMARY_KEY) or {}
    plan = _json(run.path / layout.MANIFEST).get("plan") or {}
    cfg = run.config or {}
    cores = facts.get(scaling.CORES)
    if cores is None:
        affinity = _json(run.path / layout.LOGS / "rank0.json").get("cpu_affinity")
        cores = len(affinity) if isinstance(affinity, list) and affinity else None
    micro = plan.get("per_rank_batch") or get(cfg, "batch.per_rank") or 1
    return Measured(
        world=run.world, global_batch=int(run.global_batch or 0), micro_batch=int(micro),
        step_s=float(run.step_time_s or 0.0),
        work_share=float(shares.get("data") or 0.0) + float(shares.get("compute") or 0.0),
        optimizer_share=float(shares.get("optimizer") or 0.0),
        sync_share=float(shares.get("exposed_sync") or 0.0) if run.world > 1 else 0.0,
        strategy=str(get(cfg, "strategy.name", "ddp")),
        grad_bytes=facts.get(scaling.GRAD_BYTES), param_bytes=facts.get(scaling.PARAM_BYTES),
        bucket_mb=get(cfg, "train.ddp_bucket_mb"), tokens_per_sample=run.tokens_per_sample, steps=run.steps,
        device=run.device, cores=cores, threads_per_rank=int(facts.get(scaling.THREADS) or 1),
        ranks_per_node=facts.get(scaling.LOCAL_WORLD) or plan.get("nproc_per_node"),
        reshard_after_forward=bool(get(cfg, "strategy.reshard_after_forward", True)),
        accumulate_unsharded=bool(get(cfg, "strategy.accumulate_unsharded", True)),
        spread=window_spread(summary), name=run.name)


def window_spread(summary: Mapping[str, Any]) -> float | None:
    """How much a run's own logging windows vary: half their range over their median step time (the ± a
    projection checked against the run cannot beat)."""
    times = [t for t in (summary.get("perf_windows") or {}).get("step_time_s") or [] if isinstance(t, (int, float))]
    if len(times) < 2:
        return None
    return (max(times) - min(times)) / 2 / statistics.median(times)


def doctor_link(report: Mapping[str, Any], source: str) -> Link | None:
    """The link of a ddp-doctor report's all-reduce measurement (its ``bandwidth`` check's rows), or None when the
    report holds none (run.json's doctor report measures no bandwidth) or not in ddp-doctor's shape."""
    checks = report.get("checks") if isinstance(report, Mapping) else None
    for check in checks if isinstance(checks, list) else []:
        data = check.get("data") if isinstance(check, Mapping) else None
        if not isinstance(data, Mapping) or check.get("name") != "bandwidth":
            continue
        rows, nranks = data.get("rows"), data.get("nranks")
        if _rows(rows) and isinstance(nranks, int) and not isinstance(nranks, bool):
            return fit_link(rows, nranks, f"{source} ({data.get('backend', '?')}, {nranks} ranks)")
    return None


def _rows(rows: Any) -> bool:
    """Whether ``rows`` are ddp-doctor's all-reduce rows: a non-empty list of objects with numeric sizes and times."""
    number = (int, float)
    return isinstance(rows, list) and bool(rows) and all(
        isinstance(r, Mapping) and isinstance(r.get("bytes"), number) and isinstance(r.get("time_us"), number)
        for r in rows)


def links_file(path: Path) -> Link | None:
    """The link measured in ``path``: a ``ddp-doctor --json`` report, or a run.json holding one (``doctor``).
    Raises ValueError, saying what the file holds instead, when it holds no all-reduce measurement."""
    try:
        report = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(report, dict):
        raise ValueError(f"JSON, but a {type(report).__name__}, not ddp-doctor's report (an object)")
    inner = report.get("doctor") if isinstance(report.get("doctor"), dict) else report
    link = doctor_link(inner, f"ddp-doctor, {path.name}")
    if link is None:
        raise ValueError("holds no all-reduce bandwidth measurement in ddp-doctor's shape (a check named "
                         "\"bandwidth\" with data.rows of bytes and time_us, and data.nranks)")
    return link


def links(runs: Sequence[RunLike], path: str | None, gbps: float | None, latency_us: float | None,
          inter_gbps: float | None, inter_latency_us: float | None) -> tuple[Link | None, Link | None]:
    """(within a node, between nodes): ``--link-gbps`` (with ``--link-latency-us``), else ``--links FILE``, else a
    bandwidth measurement in one of the runs' run.json; None when nothing measured one (the projection then takes
    the link from the runs' own exposed sync). Between nodes: ``--inter-node-gbps``, or None."""
    intra: Link | None = None
    if gbps is not None:
        intra = Link((latency_us or 0.0) * 1e-6, gbps, "given (--link-gbps)")
    elif path:
        intra = links_file(Path(path))
    else:
        for r in runs:
            intra = doctor_link(_json(r.path / layout.MANIFEST).get("doctor") or {}, f"ddp-doctor in {r.name}")
            if intra:
                break
    inter = Link((inter_latency_us or 0.0) * 1e-6, inter_gbps, "given (--inter-node-gbps)") if inter_gbps else None
    return intra, inter


def default_ranks_per_node(runs: Sequence[RunLike]) -> int:
    """Ranks a node holds, where not given: 8 for GPU runs (a common node), else the most ranks a measured CPU host
    ran (more ranks are more hosts like it)."""
    if any(r.device == "cuda" for r in runs):
        return 8
    return max([r.world for r in runs] or [1])
