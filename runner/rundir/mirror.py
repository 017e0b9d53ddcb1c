"""Mirroring a remote run: the locally written files (logs, TensorBoard) copied into the remote run tree, during
and after a run."""

from __future__ import annotations

import atexit
import shutil
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from ddp_runner.contract import layout
from ddp_runner.rundir.run_dir import RunDir


class Mirror:
    """Copies the locally written files (logs, TensorBoard) into a remote run tree, during and after a run."""

    def __init__(self, rd: RunDir, every_s: float = 15.0, staged: dict[str, tuple[int, int]] | None = None) -> None:
        self.rd, self.every_s, self.last = rd, every_s, time.monotonic()
        # What the remote tree holds already, {relative path: (mtime_ns, size)}: staged from it
        # (rundir.stage_logs) or copied since. Only what changed is copied: on a multi-node run another node's
        # rank may be writing a log of which this staging folder holds an older copy.
        self.sent: dict[str, tuple[int, int]] = dict(staged or {})
        self.failed: int | None = None  # how many files the last full flush could not copy (None: none ran yet)
        # The staging dir goes when the driver exits, unless its last copy failed (then it is all there is).
        atexit.register(self._remove_staging)

    @property
    def clean(self) -> bool:
        """Did the last full flush copy everything?"""
        return self.failed == 0

    def _remove_staging(self) -> None:
        if self.clean and self.rd.is_remote:
            shutil.rmtree(self.rd.local, ignore_errors=True)

    def tick(self) -> None:
        """Mirror if ``every_s`` has passed since the last copy."""
        if time.monotonic() - self.last >= self.every_s:
            self.flush()

    def flush(self, files: Iterable[Path] | None = None) -> None:
        """Copy every local file (or those of ``files`` that changed) to the remote tree now."""
        local = Path(self.rd.local)
        if files is None:
            self.last = time.monotonic()
        failed = 0
        for p in local.rglob("*") if files is None else files:
            if p.is_file() and ".tmp" not in p.name:
                rel = p.relative_to(local).as_posix()
                try:
                    st = p.stat()
                    if self.sent.get(rel) == (st.st_mtime_ns, st.st_size):
                        continue
                    if st.st_size == 0 and rel.startswith(f"{layout.STACKS}/"):
                        continue  # every rank opens one in case it is asked for; only written stacks are news
                    self.rd.fs.put_file(str(p), layout.join(self.rd.path, rel))
                    self.sent[rel] = (st.st_mtime_ns, st.st_size)
                except Exception as exc:  # noqa: BLE001 - a failed mirror must not kill the run (botocore's
                    # connection errors are no OSError); the next tick retries
                    failed += 1
                    print(f"ddp-run: warning: could not mirror {rel}: {exc}", file=sys.stderr)
        if files is None:
            self.failed = failed

    def left_behind(self) -> str | None:
        """After the last flush: where the files it could not copy stay (one console line), or None."""
        if not self.failed or not self.rd.is_remote:
            return None
        return (f"ddp-run: {self.failed} file(s) could not be copied into {self.rd.url}; they stay in"
                f" {self.rd.local}")
