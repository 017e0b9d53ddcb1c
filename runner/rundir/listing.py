"""The runs and sweeps under an output root, read for ``ddp-runs`` (runner/report/runs.py renders them).

Reads only what the run tree holds (run.json, summary.json, config.yaml, the ranks' progress records, and, for a run
that has no final figures, rank 0's TensorBoard events), on any fsspec filesystem. Statuses are the ones a reader
should believe (runner/rundir/status.py): a ``running`` run whose driver is gone reads as ``lost``. A directory that
is damaged or not a run directory is skipped with a note, never a traceback.

Layouts found under a root: ``<date>/<time>_<task>_w<N>/`` (a run), ``<date>/<time>_sweep/<job>/`` (a sweep and
its jobs), ``<job id>_<task>_w<N>/`` (a multi-node run, directly under the root). The root may also be one run or
one sweep directory itself.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import fsspec

from ddp_runner.contract import layout
from ddp_runner.contract.run_files import RunManifest, RunSummary
from ddp_runner.rundir import figures, records
from ddp_runner.rundir import status as run_status

SWEEP_JSON = "sweep.json"  # runner/report/sweep.py writes it at the end of a sweep
HYDRA_RECORD = "multirun.yaml"
_SWEEP_NAME = re.compile(r"^(\d\d-\d\d-\d\d)_sweep(_\d+)?$")
_DATE_NAME = re.compile(r"^\d{4}-\d\d-\d\d$")
# Sweep jobs that never got a run directory (sweep.json's status for them).
STATUS_REFUSED = "refused"
STATUS_NOT_RUN = "not run"
# A sweep whose record is there but some job did not complete.
STATUS_PARTIAL = "partial"
# Written by a run the scheduler stopped (issue 28: a checkpoint on every stop); runner/contract/layout.py has no
# name for it yet.
STATUS_PREEMPTED = layout.STATUS_PREEMPTED
_LIVE = (layout.STATUS_RUNNING, layout.STATUS_QUEUED)


class Damaged(Exception):  # noqa: N818 - a condition of a directory, not of this code
    """A directory that looks like a run directory but cannot be read as one (the reason is the message)."""


@dataclass
class Row:
    """One run (or sweep, or a sweep's job) as ``ddp-runs`` lists it. ``None``: not known (not recorded)."""

    name: str  # relative to the listed root
    url: str  # where it lives (a path, or a URL on a remote store)
    kind: str  # "run", "sweep", or "job" (a sweep job that got no run directory)
    status: str
    task: str | None = None
    world_size: int | None = None
    global_batch: int | None = None
    step: int | None = None
    max_steps: int | None = None
    last_loss: float | None = None
    throughput: float | None = None
    unit: str | None = None  # "samples/s" or "tokens/s"
    started: float | None = None  # Unix seconds
    note: str | None = None  # a sweep's job counts, a refused job's reason
    jobs: list[Row] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The row as plain data (``ddp-runs --json``)."""
        return asdict(self)


@dataclass
class Listing:
    """What was found under a root: rows newest first, and the directories skipped with the reason."""

    root: str
    rows: list[Row] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


# -- pure parts ------------------------------------------------------------------------------------------------

def started_at(manifest: Mapping[str, Any]) -> float | None:
    """When the run was first launched (Unix seconds): run.json's ``started`` (local time, kept across
    continuations), else its driver's process start."""
    text = manifest.get("started")
    if isinstance(text, str):
        try:
            return datetime.fromisoformat(text).timestamp()
        except ValueError:
            pass
    started = (manifest.get("driver") or {}).get("started")
    return float(started) if isinstance(started, (int, float)) else None


def final_figures(summary: Mapping[str, Any], global_batch: Any = None) -> dict[str, Any]:
    """Step, last loss and throughput from a finished run's summary.json (empty when it has none), by ddp-compare's
    rules (runner/rundir/figures.py); ``global_batch``: the plan's, else summary.json's. A summary whose values are
    of the wrong kind (hand-edited) gives none."""
    try:
        fig = figures.of_summary(summary, global_batch)
    except (TypeError, ValueError, AttributeError):
        return {}
    out: dict[str, Any] = {}
    if fig.steps is not None:
        out["step"] = fig.steps
    if fig.last_loss is not None:
        out["last_loss"] = fig.last_loss
    if fig.rate:
        out["throughput"], out["unit"] = fig.rate, fig.unit
    return out


def live_figures(scalars: dict[str, tuple[int, float]]) -> dict[str, Any]:
    """Step, last loss and throughput from the last TensorBoard scalars of a run (``{tag: (step, value)}``)."""
    out: dict[str, Any] = {}
    if "train/loss" in scalars:
        out["step"], out["last_loss"] = scalars["train/loss"]
    for tag, unit in (("perf/tokens_per_s", "tokens/s"), ("perf/samples_per_s", "samples/s")):
        if tag in scalars:
            out["throughput"], out["unit"] = scalars[tag][1], unit
            break
    return out


def sweep_status(jobs: list[Row], recorded: bool) -> str:
    """A sweep's status from its jobs: ``running`` while a job runs; without its record (sweep.json, written at the
    end), ``interrupted`` (or ``preempted``) when a job was, else ``lost`` (its driver ended before the sweep did);
    with it, ``completed`` when every job completed (or a search pruned it), else ``partial``."""
    statuses = {j.status for j in jobs}
    if statuses & set(_LIVE):
        return layout.STATUS_RUNNING
    if not recorded:
        stopped = statuses & {layout.STATUS_INTERRUPTED, STATUS_PREEMPTED}
        return min(stopped) if stopped else layout.STATUS_LOST
    # A search's pruned trials ended as the search meant them to (runner/job/search.py).
    return layout.STATUS_COMPLETED if statuses - {layout.STATUS_PRUNED} == {layout.STATUS_COMPLETED} else STATUS_PARTIAL


def job_counts(jobs: list[Row]) -> str:
    """``3 jobs: 2 completed, 1 refused``."""
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j.status] = counts.get(j.status, 0) + 1
    parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}" + (f": {parts}" if parts else "")


# -- TensorBoard events, read without TensorFlow --------------------------------------------------------------

def tb_scalars(data: bytes) -> dict[str, tuple[int, float]]:
    """The last (step, value) of every scalar in one TensorBoard event file's bytes (TFRecord framing: length,
    its CRC, the Event protobuf, its CRC). A record cut short (a writer killed mid-write) ends the reading."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.util import tensor_util

    out: dict[str, tuple[int, float]] = {}
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + 12 + length + 4
        if end > len(data):
            break
        event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
        pos = end
        for v in event.summary.value:
            if v.HasField("simple_value"):
                out[v.tag] = (int(event.step), float(v.simple_value))
            elif v.HasField("tensor") and v.metadata.plugin_data.plugin_name in ("scalars", ""):
                arr = tensor_util.make_ndarray(v.tensor)
                if arr.size == 1 and arr.dtype.kind in "fiu":
                    out[v.tag] = (int(event.step), float(arr.reshape(()).item()))
    return out


def _tb_last(fs: Any, path: str) -> dict[str, tuple[int, float]]:
    """Rank 0's last scalars in the run's tb/ (newest event file last); empty when there are none or they cannot
    be read (a listing never fails on a run's TensorBoard files)."""
    out: dict[str, tuple[int, float]] = {}
    try:
        files = sorted(fs.glob(layout.join(path, layout.TB, "events.out.tfevents.*")))
        for f in files:
            out.update(tb_scalars(fs.cat_file(f)))
    except Exception:  # noqa: BLE001 - a damaged event file only costs the figures
        return out
    return out


# -- reading the tree ----------------------------------------------------------------------------------------------

def _manifest(fs: Any, path: str) -> RunManifest:
    """A run directory's run.json, checked to be a manifest; :class:`Damaged` (the reason) otherwise."""
    try:
        manifest = records.read_json(fs, layout.join(path, layout.MANIFEST), records.fix_for(layout.MANIFEST, path),
                                     want=object)
    except records.DamagedFile as damaged:
        raise Damaged(f"{layout.MANIFEST}: {damaged.problem}") from None
    if manifest is None:
        raise Damaged(f"no {layout.MANIFEST}")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("plan"), dict) or "status" not in manifest:
        what = "empty (its driver died while creating it?)" if manifest == {} else "not a ddp-run manifest"
        raise Damaged(f"{layout.MANIFEST} is {what}")
    if (problem := records.manifest_problem(manifest)) is not None:
        raise Damaged(f"{layout.MANIFEST} {problem}")
    return manifest  # type: ignore[return-value]  # checked as far as a listing relies on it


def _summary(fs: Any, path: str) -> RunSummary:
    """A run directory's summary.json, {} when it has none or it is damaged (a listing only goes without its
    figures: ``ddp-compare`` names the damage)."""
    try:
        return records.read_summary(fs, path) or {}
    except records.DamagedFile:
        return {}


def _step_reached(fs: Any, path: str, world_size: Any) -> int | None:
    """The furthest optimizer step in the ranks' progress records, however the run ended. Every rank's: a rank
    stopped by a peer's failure can be killed before it records the step that peer finished with it."""
    ranks = range(world_size if isinstance(world_size, int) and world_size > 0 else 1)
    try:
        got = fs.cat([layout.join(path, layout.rank_progress(r)) for r in ranks], on_error="omit")
    except (ValueError, OSError):
        return None
    steps = []
    for where, data in got.items():
        try:
            step = records.parse_json(data, where, "").get("step") if isinstance(data, bytes) else None
        except records.DamagedFile:  # a record cut short by a killed rank: the others tell
            continue
        if isinstance(step, int):
            steps.append(step)
    return max(steps, default=None)


def _max_steps(fs: Any, path: str) -> int | None:
    """``train.max_steps`` from config.yaml (None when training is by epochs, or unreadable)."""
    import yaml

    try:
        conf = yaml.safe_load(fs.cat_file(layout.join(path, layout.CONFIG))) or {}
        value = (conf.get("train") or {}).get("max_steps")
    except Exception:  # noqa: BLE001 - the figure is optional
        return None
    return value if isinstance(value, int) else None


def read_run(fs: Any, path: str, name: str, url: str | None = None, now: float | None = None) -> Row:
    """One run directory as a row; :class:`Damaged` when its run.json is missing, unreadable or not a run's."""
    manifest = _manifest(fs, path)
    plan = manifest["plan"]
    row = Row(name=name, url=url or path, kind="run",
              status=run_status.effective_status(manifest, time.time() if now is None else now,
                                                 run_status.local_pid_alive),
              task=manifest.get("task"), world_size=plan.get("world_size"), global_batch=plan.get("global_batch"),
              started=started_at(manifest), max_steps=_max_steps(fs, path))
    found = final_figures(_summary(fs, path), plan.get("global_batch"))
    if row.status != layout.STATUS_COMPLETED:  # TensorBoard is fresher (a continued run's summary.json is stale)
        found = {**found, **live_figures(_tb_last(fs, path))}
    elif "last_loss" not in found:
        found = {**live_figures(_tb_last(fs, path)), **found}
    if "step" not in found or row.status != layout.STATUS_COMPLETED:
        reached = _step_reached(fs, path, plan.get("world_size"))
        if reached is not None and reached >= found.get("step", 0):
            found["step"] = reached
    for k, v in found.items():
        setattr(row, k, v)
    if row.status == layout.STATUS_COMPLETED and row.max_steps is None:
        row.max_steps = row.step  # trained by epochs: the steps it took were all of them
    return row


def _sweep_started(name: str, parent: str, jobs: list[Row]) -> float | None:
    m = _SWEEP_NAME.match(name)
    if m and _DATE_NAME.match(parent):
        try:
            return datetime.strptime(f"{parent} {m.group(1)}", "%Y-%m-%d %H-%M-%S").timestamp()
        except ValueError:
            pass
    times = [j.started for j in jobs if j.started is not None]
    return min(times) if times else None


def read_sweep(fs: Any, path: str, name: str, listing: Listing, now: float | None = None) -> Row:
    """A sweep directory: its jobs (run directories, and the jobs sweep.json records without one), in order."""
    record = None
    try:
        record = records.read_json(fs, layout.join(path, SWEEP_JSON), records.fix_for(SWEEP_JSON, path), want=object)
    except records.DamagedFile as damaged:
        listing.skipped.append((layout.join(name, SWEEP_JSON), damaged.problem))
    jobs: list[Row] = []
    for child in _subdirs(fs, path, listing, name):
        if child.rstrip("/").rsplit("/", 1)[-1] == layout.SWEEP_JOB_LOGS:
            continue  # the sweep's own folder of its jobs' consoles, no run
        child_name = layout.join(name, child.rsplit("/", 1)[-1])
        try:
            jobs.append(read_run(fs, child, child_name, _url(fs, child), now))
        except Damaged as why:
            listing.skipped.append((child_name, str(why)))
    seen = {j.url.rstrip("/").rsplit("/", 1)[-1] for j in jobs}
    for job in (record or {}).get("jobs", []) if isinstance(record, dict) else []:
        if not job.get("run_dir") or str(job["run_dir"]).rstrip("/").rsplit("/", 1)[-1] not in seen:
            if job.get("status") in (STATUS_REFUSED, STATUS_NOT_RUN):
                jobs.append(Row(name=layout.join(name, f"job {job.get('job')}"), url="", kind="job",
                                status=str(job["status"]), note=str(job.get("reason") or "")[:200]))
    jobs.sort(key=lambda j: _job_number(j.name))
    parent = path.rstrip("/").rsplit("/", 2)[-2] if path.count("/") else ""
    return Row(name=name, url=_url(fs, path), kind="sweep", status=sweep_status(jobs, isinstance(record, dict)),
               task=_one_or_none({j.task for j in jobs if j.task}), started=_sweep_started(
                   path.rstrip("/").rsplit("/", 1)[-1], parent, jobs), note=job_counts(jobs), jobs=jobs)


def _job_number(name: str) -> tuple[int, str]:
    last = name.rsplit("/", 1)[-1]
    m = re.match(r"^(?:job )?(\d+)", last)
    return (int(m.group(1)) if m else 1 << 30, last)


def _one_or_none(values: set[str]) -> str | None:
    return next(iter(values)) if len(values) == 1 else (", ".join(sorted(values)) if values else None)


def _subdirs(fs: Any, path: str, listing: Listing | None = None, name: str = "") -> list[str]:
    """The folders in ``path``, hidden ones (``.compile_cache``) left out; none, with a note in ``listing``, when
    ``path`` cannot be listed (no permission, a store error)."""
    try:
        entries = fs.ls(path, detail=True)
    except OSError as exc:
        if listing is None:
            raise
        listing.skipped.append((name or path, f"cannot be listed ({type(exc).__name__}: {str(exc)[:120]})"))
        return []
    return sorted(e["name"].rstrip("/") for e in entries if e.get("type") == "directory"
                  and not e["name"].rstrip("/").rsplit("/", 1)[-1].startswith("."))


def _url(fs: Any, path: str) -> str:
    from fsspec.implementations.local import LocalFileSystem

    return path if isinstance(fs, LocalFileSystem) else fs.unstrip_protocol(path)


def _kind(fs: Any, path: str) -> str:
    """``run``, ``sweep`` or ``folder`` (something to look into)."""
    if fs.exists(layout.join(path, layout.MANIFEST)) or fs.exists(layout.join(path, layout.CONFIG)):
        return "run"
    leaf = path.rstrip("/").rsplit("/", 1)[-1]
    if _SWEEP_NAME.match(leaf) or fs.exists(layout.join(path, SWEEP_JSON)) or fs.exists(
            layout.join(path, HYDRA_RECORD)):
        return "sweep"
    return "folder"


def is_sweep(url: str) -> bool:
    """Is ``url`` a sweep directory (for a message that points at ``ddp-runs <sweep>``)?"""
    try:
        fs, path = fsspec.core.url_to_fs(url)
        return _kind(fs, path.rstrip("/")) == "sweep"
    except (OSError, ValueError, ImportError):
        return False


def _visit(fs: Any, path: str, name: str, depth: int, listing: Listing, now: float | None) -> None:
    kind = _kind(fs, path)
    if kind == "run":
        try:
            listing.rows.append(read_run(fs, path, name, _url(fs, path), now))
        except Damaged as why:
            listing.skipped.append((name, str(why)))
    elif kind == "sweep":
        listing.rows.append(read_sweep(fs, path, name, listing, now))
    elif depth < 2:
        for child in _subdirs(fs, path, listing, name):
            leaf = child.rsplit("/", 1)[-1]
            _visit(fs, child, layout.join(name, leaf) if name else leaf, depth + 1, listing, now)
    elif re.match(r"^\d\d-\d\d-\d\d_", name.rsplit("/", 1)[-1]):  # named like a run, holds none of its files
        listing.skipped.append((name, f"no {layout.MANIFEST} (a run directory whose driver never wrote it?)"))


def scan(root: str, now: float | None = None) -> Listing:
    """Every run and sweep under ``root`` (an output root, a date folder, a sweep or one run directory; any
    fsspec URL), newest first. FileNotFoundError when ``root`` does not exist."""
    fs, path = fsspec.core.url_to_fs(root)
    path = path.rstrip("/") or "/"
    if not fs.isdir(path):
        raise FileNotFoundError(root)
    listing = Listing(root=root)
    kind = _kind(fs, path)
    if kind == "folder":
        for child in _subdirs(fs, path):
            _visit(fs, child, child.rsplit("/", 1)[-1], 1, listing, now)
    else:
        _visit(fs, path, path.rsplit("/", 1)[-1], 0, listing, now)
    listing.rows.sort(key=lambda r: (r.started or 0.0, r.name), reverse=True)
    return listing
