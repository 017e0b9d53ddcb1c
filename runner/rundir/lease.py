"""One writer per run directory: the driver's lease on it (``driver.json``, ``layout.DRIVER_LEASE``).

Two drivers must never train into one run directory (their checkpoints, logs and TensorBoard series would
interleave). A driver takes the lease before it writes anything into a run directory and holds it until it
exits; a second driver is refused with exit 2, naming the holder's host and pid.

- **Local disk**: an exclusive ``flock`` on ``driver.json``, held by an open descriptor for the driver's
  lifetime. The kernel drops it when the driver exits, however it dies (SIGKILL included), so a dead driver
  never blocks a resume. The file itself is never deleted (deleting a lock file races with a second locker);
  it holds the last holder's host and pid, for the refusal's message. (NFS: ``flock`` is emulated with POSIX
  locks on Linux clients, which are per host; good enough for one driver host per run directory.)
- **Object store (fsspec, e.g. s3://)**: no locks exist. The lease is an object holding host, pid, process start
  time, a random token and a heartbeat. It is taken with a *conditional* put, ``If-None-Match: *`` when there is
  none and ``If-Match: <its ETag>`` over a stale one, so of two drivers racing for it exactly one wins, on stores
  that honour conditional writes (AWS S3 since 2024, MinIO, moto). A lease is stale when its heartbeat is older
  than ``status.STALE_AFTER_S`` or its driver ran on this host and is gone. The holder refreshes the heartbeat
  with ``If-Match`` on its own last ETag: if that fails, another driver has taken over (this one had looked dead)
  and this driver stops its workers at once without finalising. On a store that ignores the conditions, the
  re-read after each put is the only guard: two drivers that both write and re-read inside one round trip can
  both proceed, and the loser finds out at its next heartbeat (``status.heartbeat_every_s``).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ddp_runner.contract import layout
from ddp_runner.contract.errors import PlanError
from ddp_runner.rundir import status


class Taken(Exception):  # noqa: N818 - a condition, not a failure of this code
    """The lease is held by someone else (``holder``: their record, when it could be read)."""

    def __init__(self, holder: dict[str, Any] | None) -> None:
        super().__init__(holder)
        self.holder = holder


@dataclass
class Lease:
    """A driver's hold on one run directory; :meth:`release` gives it up (exiting does too, locally)."""

    fs: fsspec.AbstractFileSystem
    path: str  # the lease file or object
    record: dict[str, Any]
    fd: int | None = None  # local: the descriptor that holds the flock
    etag: str | None = None  # remote: our last write's ETag
    lost: bool = False  # remote: another driver took over
    last: float = field(default_factory=time.monotonic)

    def refresh(self) -> None:
        """Renew the heartbeat (object stores; at most every ``status.heartbeat_every_s``). Sets ``lost`` and
        says so when another driver holds the lease now."""
        if self.fd is not None or self.lost or time.monotonic() - self.last < status.heartbeat_every_s():
            return
        self.last = time.monotonic()
        self.record["heartbeat"] = time.time()
        try:
            self.etag = _put(self.fs, self.path, self.record, {"IfMatch": self.etag} if self.etag else {})
            if _read(self.fs, self.path)[0].get("token") == self.record["token"]:
                return
        except _Conflict:
            pass
        except Exception as exc:  # noqa: BLE001 - a store blip: keep training, try again at the next beat
            print(f"ddp-run: warning: could not renew the lease {self.path}: {exc}", file=sys.stderr, flush=True)
            return
        self.lost = True
        holder = _read_quietly(self.fs, self.path)
        print(f"ddp-run: LOST the run directory: another driver ({_who(holder)}) took over {self.path} while this"
              " one looked dead; stopping this driver's workers, leaving run.json to it", file=sys.stderr, flush=True)

    def release(self) -> None:
        """Give the lease up (idempotent). A remote lease object is deleted only while it is still ours."""
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None
            return
        if self.lost or self.etag is None:
            return
        try:
            if _read(self.fs, self.path)[0].get("token") == self.record["token"]:
                self.fs.rm_file(self.path)
        except Exception:  # noqa: BLE001, S110 - a stale lease left behind is taken over after STALE_AFTER_S
            pass
        self.etag = None


class _Conflict(Exception):
    """A conditional put was refused (HTTP 412): someone else wrote the lease first."""


def _who(holder: dict[str, Any] | None) -> str:
    return status.describe_driver({"driver": holder or {}})


def _read(fs: fsspec.AbstractFileSystem, path: str) -> tuple[dict[str, Any], str | None]:
    fs.invalidate_cache(path)
    info = fs.info(path)
    return json.loads(fs.cat_file(path) or b"{}"), info.get("ETag")


def _read_quietly(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, Any] | None:
    try:
        return _read(fs, path)[0]
    except Exception:  # noqa: BLE001 - only for a message
        return None


def _put(fs: fsspec.AbstractFileSystem, path: str, record: dict[str, Any], condition: dict[str, str]) -> str | None:
    """Write ``record`` to ``path`` if ``condition`` holds; return the new ETag; raise _Conflict if it does not."""
    try:
        fs.pipe_file(path, json.dumps(record).encode(), **condition)
    except FileExistsError as exc:
        raise _Conflict() from exc
    except OSError as exc:  # s3fs maps 412 PreconditionFailed (If-Match) to a plain OSError
        if "pre-condition" in str(exc).lower() or "precondition" in str(exc).lower():
            raise _Conflict() from exc
        raise
    fs.invalidate_cache(path)
    return fs.info(path).get("ETag")


def _stale(holder: dict[str, Any]) -> bool:
    """Is the driver that wrote this lease gone (runner/rundir/status.py's rule for run.json)?"""
    return status.status_of({"status": layout.STATUS_RUNNING, "driver": holder}) == layout.STATUS_LOST


def _take_local(path: str, record: dict[str, Any]) -> Lease:
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
        except ValueError:
            holder = None
        os.close(fd)
        raise Taken(holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return Lease(LocalFileSystem(), path, record, fd=fd)


def _take_remote(fs: fsspec.AbstractFileSystem, path: str, record: dict[str, Any]) -> Lease:
    try:
        holder, etag = _read(fs, path)
    except FileNotFoundError:
        holder, etag = None, None
    if holder is not None and not _stale(holder):
        raise Taken(holder)
    try:
        mine = _put(fs, path, record, {"IfMatch": etag} if etag else {"IfNoneMatch": "*"})
    except _Conflict:
        raise Taken(_read_quietly(fs, path)) from None
    # On a store that ignored the condition, the last writer wins: only the one whose token is there holds it.
    now, _ = _read(fs, path)
    if now.get("token") != record["token"]:
        raise Taken(now)
    return Lease(fs, path, record, etag=mine)


def take(fs: fsspec.AbstractFileSystem, run_path: str) -> Lease:
    """Take the lease on the run directory at ``run_path`` (a path of ``fs``); raise :class:`Taken` if a live
    driver holds it."""
    record = {**status.this_driver(), "token": secrets.token_hex(8)}
    path = layout.join(run_path, layout.DRIVER_LEASE)
    if isinstance(fs, LocalFileSystem):
        return _take_local(path, record)
    return _take_remote(fs, path, record)


def unwritable(url: str, exc: BaseException) -> PlanError:
    """The refusal (exit 2, key ``resume``) of a run directory this driver cannot write: a read-only filesystem,
    permissions, a store that refuses the write. A new run on such a root is refused as ``output.root``."""
    first = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
    return PlanError("resume", url, f"cannot be written ({first}): continuing it writes its lease, checkpoints, logs"
                     " and run.json there",
                     "make its filesystem writable (e.g. remount it read-write), or copy the run directory to a"
                     f" writable disk and continue the copy: cp -r {url} <dir>/ && ddp-run"
                     f" resume=<dir>/{url.rstrip('/').rsplit('/', 1)[-1]}")


def take_or_refuse(fs: fsspec.AbstractFileSystem, run_path: str, url: str) -> Lease:
    """:func:`take`, refusing (exit 2) with the live holder's host and pid when it is held, or as
    :func:`unwritable` when the lease cannot be written (an object store that refuses the write)."""
    try:
        return take(fs, run_path)
    except OSError as exc:
        raise unwritable(url, exc) from exc
    except Taken as held:
        d = held.holder or {}
        raise PlanError("resume", url, f"is being written by another live driver ({_who(held.holder)}); one driver"
                        " per run directory",
                        f"wait for it to end, or stop it (Ctrl-C, or kill -INT {d.get('pid')} on {d.get('host')})"
                        f" and resume then. A lease counts as stale (and is taken over by the next resume) once its"
                        f" driver on this host is gone, or, for a driver on another host, {status.STALE_AFTER_S:.0f} s"
                        " after its last heartbeat: if that host died, resume again after that") from None
