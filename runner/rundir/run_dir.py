"""The run tree on any fsspec filesystem: create it (only the driver does), write and read its files."""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ddp_runner.contract import layout
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.osutil import atomic_write
from ddp_runner.rundir import lost_store, records
from ddp_runner.rundir.lease import Lease, Taken, take, unwritable


@dataclass
class RunDir:
    """A run directory: ``url`` is where it lives; ``local`` is where local-only writers write.

    For a local root the two are the same directory; for a remote root (s3://…), ``local`` is a staging
    directory whose contents the driver mirrors into ``url``.
    """

    url: str
    local: str
    fs: fsspec.AbstractFileSystem
    path: str
    lease: Lease | None = None  # this driver's hold on it (runner/rundir/lease.py), taken before anything is written
    continued: bool = False  # it holds an earlier launch of the same run, continued in place by this one

    @property
    def is_remote(self) -> bool:
        return not isinstance(self.fs, LocalFileSystem)

    def write_text(self, rel: str, text: str) -> None:
        """Write a file of the run tree (atomically on local disks: readers never see half of it)."""
        target = layout.join(self.path, rel)
        if self.is_remote:
            with self.fs.open(target, "w") as f:
                f.write(text)
            return
        atomic_write(target, text)

    def write_json(self, rel: str, obj: Mapping[str, Any]) -> None:
        """Write a JSON record of the run tree (run.json, summary.json: runner/contract/run_files.py)."""
        self.write_text(rel, json.dumps(obj, indent=2, default=str, ensure_ascii=False) + "\n")

    def read_json(self, rel: str) -> dict[str, Any]:
        """A JSON object of the run tree (run.json, summary.json: runner/contract/run_files.py); the run tree's one
        reader, :func:`ddp_runner.rundir.records.read_json`: :class:`~ddp_runner.rundir.records.DamagedFile` (a
        ValueError) when it is missing, unreadable, or not a JSON object."""
        # One whole read (records.read_json's cat_file): a file object on an object store reads by ranges pinned to
        # the version it first saw, and fails when another node replaces the file meanwhile (run.json, as node 0
        # opens a restart).
        return records.read_json(self.fs, layout.join(self.path, rel), records.fix_for(rel, self.url),
                                 missing_ok=False)

    def remove(self) -> None:
        """Delete the whole run directory (used when a refusal comes after creation)."""
        if self.lease is not None:
            self.lease.release()
        self.fs.rm(self.path, recursive=True)
        if self.is_remote:
            shutil.rmtree(self.local, ignore_errors=True)


def _unwritable(root: str, exc: BaseException) -> PlanError:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    fix = "point output.root at a writable directory or bucket, e.g. output.root=outputs"
    if "credential" in first.lower():
        fix = ("give the storage its credentials (for s3://: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a"
               " profile, or an instance role), or " + fix)
    return PlanError("output.root", root, f"cannot be written ({type(exc).__name__}: {first})", fix)


def check_writable(rd: RunDir) -> None:
    """Refuse (exit 2, key ``resume``) to continue a run directory this driver cannot write, before its lease or
    anything else is written there: a resume on a read-only filesystem is refused as a fresh run on one is
    (``output.root``), never ended by an OSError from ``driver.json``. A local disk is probed with a file made and
    removed in the run directory and in the folders the workers write into (a read-only mount, permissions); an
    object store is proven by the lease's own first write (:func:`~ddp_runner.rundir.lease.take_or_refuse` refuses
    the same way)."""
    if rd.is_remote:
        return
    for folder in (rd.local, os.path.join(rd.local, layout.CHECKPOINTS), os.path.join(rd.local, layout.LOGS)):
        if folder != rd.local and not os.path.isdir(folder):
            continue  # made when the run starts, as for a new run
        try:
            fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
            os.close(fd)
            os.remove(probe)
        except OSError as exc:
            raise unwritable(rd.url, exc) from exc


# Object stores whose first path part is a bucket (s3fs, gcsfs, adlfs): their makedirs creates a missing bucket.
_BUCKET_STORES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"}


def _check_bucket(fs: Any, root_path: str, root: str) -> None:
    """Refuse a root whose bucket does not exist: a typo must not create a new bucket (s3fs would)."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if not protocols & _BUCKET_STORES:
        return
    bucket = root_path.strip("/").split("/", 1)[0]
    try:
        fs.info(bucket)  # unlike exists(), lets a missing credential through as its own error
    except FileNotFoundError:
        raise PlanError("output.root", root, f"its bucket {bucket!r} does not exist (or cannot be listed)",
                        "create the bucket first, or fix its name in output.root; ddp-run never creates buckets",
                        ) from None


def staging_dir(path: str) -> str:
    """A fresh local staging directory for a remote run (logs and TensorBoard are written here, then mirrored).
    From here on this process copies to the store, and a lost store is reported by its own lines only
    (:mod:`lost_store`)."""
    lost_store.quiet_unretrieved_connection_errors()
    local = tempfile.mkdtemp(prefix=f"ddp-run-{path.rsplit('/', 1)[-1]}-")
    for sub in (layout.LOGS, layout.TB):
        os.makedirs(os.path.join(local, sub), exist_ok=True)
    return local


def open_run_dir(url: str) -> RunDir:
    """An existing run directory (for ``resume=<run dir>``). A remote one gets its local staging directory only
    in :func:`prepare_continue`, once the plan is accepted: a refusal or a dry run leaves nothing behind."""
    fs, path = fsspec.core.url_to_fs(url)
    path = path.rstrip("/")
    if isinstance(fs, LocalFileSystem):
        return RunDir(url=path, local=path, fs=fs, path=path)
    return RunDir(url=fs.unstrip_protocol(path), local="", fs=fs, path=path)


def stage_logs(rd: RunDir) -> dict[str, tuple[int, int]]:
    """A remote run: copy the shared tree's ``logs/`` (error records aside) into this driver's staging directory,
    so that ranks started here append to their earlier lines. Returns what was staged, ``{relative path:
    (mtime_ns, size)}``, for :class:`ddp_runner.rundir.mirror.Mirror`, which then uploads a staged file only once it has
    changed: a node never pushes back its stale copy of a log that another node's rank writes now."""
    staged: dict[str, tuple[int, int]] = {}
    if not rd.is_remote:
        return staged
    logs = layout.join(rd.path, layout.LOGS)
    rd.local = rd.local or staging_dir(rd.path)
    rd.fs.invalidate_cache(logs)
    for remote in rd.fs.find(logs):
        rel = remote[len(logs):].lstrip("/")
        if rel and not rel.endswith(".error.json"):
            target = os.path.join(rd.local, layout.LOGS, *rel.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            rd.fs.get_file(remote, target)
            st = os.stat(target)
            staged[f"{layout.LOGS}/{rel}"] = (st.st_mtime_ns, st.st_size)
    return staged


def prepare_continue(rd: RunDir) -> dict[str, tuple[int, int]]:
    """Get an existing run directory ready to be continued in place by a new launch; returns what
    :func:`stage_logs` staged.

    Error records of the earlier attempt are removed (they would otherwise be taken for this attempt's root
    cause), and so are temporary files a killed driver left; for a remote run the earlier logs are staged
    locally, so that the new attempt appends to them and the mirror does not overwrite them with only the new
    lines.
    """
    logs = layout.join(rd.path, layout.LOGS)
    staged = stage_logs(rd)
    # A driver killed in the middle of an atomic write leaves its temporary sibling (osutil.atomic_write).
    for name in (layout.MANIFEST, layout.SUMMARY, layout.CONFIG):
        for p in glob.glob(os.path.join(rd.local, f".{name}.*.tmp")):
            os.remove(p)
    for remote in rd.fs.glob(layout.join(logs, "rank*.error.json")):
        rd.fs.rm_file(remote)
    for p in glob.glob(os.path.join(rd.local, layout.LOGS, "rank*.error.json")):
        os.remove(p)
    return staged


def _claim(fs: fsspec.AbstractFileSystem, parent: str, base: str, lease: bool = False) -> tuple[str, Lease | None]:
    """Create ``parent/base`` or ``parent/base_<n>`` for the first free n; return its path (and, with ``lease``,
    this driver's lease on it).

    On local disks ``mkdir`` is atomic, so two drivers started in the same second never share a name. An object
    store has no directories: there the lease's conditional put (runner/rundir/lease.py) is the claim, so two drivers
    never share a name there either.
    """
    fs.makedirs(parent, exist_ok=True)
    n = 0
    while True:
        path = layout.join(parent, base if n == 0 else f"{base}_{n}")
        if isinstance(fs, LocalFileSystem):
            try:
                os.mkdir(path)
                return path, take(fs, path) if lease else None
            except FileExistsError:
                pass
        elif not fs.exists(path):
            try:
                held = take(fs, path) if lease else None
            except Taken:  # another driver claimed this name a moment ago
                n += 1
                continue
            fs.makedirs(path, exist_ok=True)
            return path, held
        n += 1


def _dated(root_path: str, now: datetime) -> str:
    return layout.join(root_path.rstrip("/") or "/", now.strftime("%Y-%m-%d"))  # "/" stays the filesystem root


def create_sweep_dir(root: str, now: datetime) -> str:
    """Make ``<root>/<YYYY-MM-DD>/<HH-MM-SS>_sweep[_<n>]`` (a filesystem path) for the jobs of one sweep."""
    try:
        fs, root_path = fsspec.core.url_to_fs(root)
        _check_bucket(fs, root_path, root)
        return _claim(fs, _dated(root_path, now), f"{now.strftime('%H-%M-%S')}_sweep")[0]
    except PlanError:
        raise
    except Exception as exc:  # a backend's own error types too (botocore's NoCredentialsError is no OSError)
        raise _unwritable(root, exc) from exc


def create_run_dir(root: str, task: str, world_size: int, now: datetime, parent: str | None = None,
                   name: str | None = None) -> RunDir:
    """Make ``<root>/<YYYY-MM-DD>/<HH-MM-SS>_<task>_w<ws>[_<n>]`` with its subfolders.

    Two runs started in the same second get distinct directories. ``parent``/``name`` place a sweep job
    inside its sweep directory. Raises :class:`PlanError` when the root cannot be written, leaving
    nothing behind.
    """
    try:
        fs, root_path = fsspec.core.url_to_fs(root)
        _check_bucket(fs, root_path, root)
        parent_path = parent or _dated(root_path, now)
        made_parent = not fs.exists(parent_path)
    except PlanError:
        raise
    except Exception as exc:  # a backend's own error types too (botocore's NoCredentialsError is no OSError)
        raise _unwritable(root, exc) from exc
    local_fs = isinstance(fs, LocalFileSystem)
    try:
        path, held = _claim(fs, parent_path, name or layout.run_name(now.strftime("%H-%M-%S"), task, world_size),
                            lease=True)
        for sub in (layout.LOGS, layout.TB, layout.CHECKPOINTS):
            fs.makedirs(layout.join(path, sub), exist_ok=True)
        if not local_fs:  # prove the bucket accepts writes now, not at the first checkpoint
            fs.pipe_file(layout.join(path, layout.MANIFEST), b"{}")
    except Exception as exc:  # a backend's own error types too: a refusal with its first line, not a traceback
        if made_parent and local_fs:
            shutil.rmtree(parent_path, ignore_errors=True)
        raise _unwritable(root, exc) from exc
    if local_fs:
        return RunDir(url=path, local=path, fs=fs, path=path, lease=held)
    return RunDir(url=fs.unstrip_protocol(path), local=staging_dir(path), fs=fs, path=path, lease=held)
