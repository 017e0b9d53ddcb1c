"""A little disk space held back for a run's last records: a disk that fills while the run trains (its checkpoints,
logs) must still take the final run.json and summary.json, so that run.json never stays ``running`` and the console
can name the failed save and the checkpoint to continue from.

The driver writes :data:`RESERVE` (``.disk_reserve``, :data:`RESERVE_BYTES` of incompressible bytes) into a local run
directory when it launches, and deletes it when finalising starts, before it writes anything: the space it frees is
what the final records are written into. A run directory on an object store has no disk to fill and gets none.
"""

from __future__ import annotations

import contextlib
import os
import sys

from ddp_runner.rundir.run_dir import RunDir

RESERVE = ".disk_reserve"
RESERVE_BYTES = 1 << 20  # far more than run.json and summary.json together (summary.json holds ≤ 256 losses)


def _path(rd: RunDir) -> str:
    return os.path.join(rd.local, RESERVE)


def hold(rd: RunDir) -> bool:
    """Write the reserve into a local run directory (True), or warn that the disk cannot spare it (False): the run
    goes on, and a full disk may then leave run.json as the launch wrote it."""
    if rd.is_remote:
        return False
    try:
        with open(_path(rd), "wb") as f:
            f.write(os.urandom(RESERVE_BYTES))  # written, not sparse nor compressible: the blocks are really taken
        return True
    except OSError as exc:
        release(rd)
        print(f"ddp-run: warning: the disk holding {rd.url} cannot spare {RESERVE_BYTES >> 20} MiB for the run's"
              f" final records ({type(exc).__name__}: {exc.strerror or exc}); if it fills, run.json may not record"
              " how the run ended", file=sys.stderr, flush=True)
        return False


def release(rd: RunDir) -> None:
    """Delete the reserve (finalising starts; idempotent, never raises): its space takes the final records."""
    if rd.is_remote or not rd.local:
        return
    with contextlib.suppress(OSError):
        os.remove(_path(rd))
