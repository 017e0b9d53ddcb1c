"""The other nodes' ranks under a remote run root (``s3://``…), for node 0's hang watchdog.

On a shared filesystem every rank writes its progress record and stacks into the one run directory: node 0's
watchdog reads them there, and its dump request reaches every rank. Under a remote root each node's ranks write into
that node's staging folder instead, so:

- every other node's driver mirrors its ranks' progress records, stacks and error records every ``EVERY_S`` and
  copies node 0's dump request from the run tree into its own staging folder, where its ranks' progress threads
  see it and write their stacks (:class:`Relay`);
- node 0's watchdog reads the other ranks' records from the run tree (:class:`PeerRanks`) and gives them ``LAG_S``
  more before it calls them stuck, since their copies arrive that much later.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ddp_runner.console import textfit
from ddp_runner.contract import layout
from ddp_runner.rundir.mirror import Mirror
from ddp_runner.rundir.run_dir import RunDir

EVERY_S = 2.0
# A record's copy is older than the rank's own file by at most: its writer's second, the other node's mirror
# period and this node's read period.
LAG_S = 1.0 + 2 * EVERY_S
_RANK_FILE = re.compile(r"rank(\d+)\.json$")


def quick_files(local: str) -> list[Path]:
    """The files another node must see soon: its ranks' progress records, stacks (once written: every rank opens
    an empty one in case they are asked for) and error records."""
    root = Path(local)
    stacks = [p for p in root.glob(f"{layout.STACKS}/rank*") if p.is_file() and p.stat().st_size > 0]
    return [*root.glob(f"{layout.PROGRESS}/rank*.json"), *stacks, *root.glob(f"{layout.LOGS}/rank*.error.json")]


class PeerRanks:
    """Node 0's view of the ranks on other nodes: their progress records, error records and stacks, read from the
    run tree that their drivers mirror to."""

    def __init__(self, rd: RunDir, every_s: float = EVERY_S, lag_s: float = LAG_S) -> None:
        self.rd, self.every_s, self.lag_s = rd, every_s, lag_s
        self.last = float("-inf")
        self.records: dict[int, dict[str, Any]] = {}
        self.warned = False

    def _path(self, rel: str) -> str:
        return layout.join(self.rd.path, rel)

    def reset(self) -> None:
        """Before a launch: remove an earlier launch's progress records and dump request from the run tree (a
        stale record would be judged as a rank of this launch that never moves)."""
        for rel in (layout.PROGRESS, layout.DUMP_REQUEST):
            try:
                self.rd.fs.rm(self._path(rel), recursive=True)
            except FileNotFoundError:
                pass
            except Exception as exc:  # noqa: BLE001 - the run goes on; a stale record then shows in hang.json
                self._warn(exc)
        self.rd.fs.invalidate_cache()

    def progress(self, ranks: Iterable[int]) -> dict[int, dict[str, Any]]:
        """The last copied progress record of each of ``ranks`` that has one (read at most every ``every_s``)."""
        ranks = list(ranks)
        if ranks and time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            try:
                self.rd.fs.invalidate_cache(self._path(layout.PROGRESS))
                got = self.rd.fs.cat([self._path(layout.rank_progress(r)) for r in ranks], on_error="omit")
            except Exception as exc:  # noqa: BLE001 - a store blip must not stop the watch: the next read retries
                self._warn(exc)
                got = {}
            for path, data in got.items():
                match = _RANK_FILE.search(path)
                with contextlib.suppress(ValueError):
                    if match and isinstance(data, bytes):
                        self.records[int(match.group(1))] = json.loads(data)
        return {r: self.records[r] for r in ranks if r in self.records}

    def failed(self, ranks: Iterable[int]) -> list[int]:
        """Those of ``ranks`` whose error record is in the run tree."""
        out = []
        for r in ranks:
            with contextlib.suppress(Exception):
                if self.rd.fs.exists(self._path(layout.rank_error(r))):
                    out.append(r)
        return out

    def request_dump(self) -> None:
        """Ask every other node's ranks for their stacks (and NCCL flight recorders)."""
        try:
            self.rd.fs.pipe_file(self._path(layout.DUMP_REQUEST), b"")
        except Exception as exc:  # noqa: BLE001 - best effort: the hang is still named from the records
            self._warn(exc)

    def stack(self, rank: int) -> str | None:
        """A rank's Python stacks as its node mirrored them, or None while they are not there."""
        with contextlib.suppress(Exception):
            self.rd.fs.invalidate_cache(self._path(layout.STACKS))
            text = self.rd.fs.cat_file(self._path(layout.rank_stack(rank))).decode(errors="replace")
            return text or None
        return None

    def _warn(self, exc: Exception) -> None:
        if not self.warned:
            self.warned = True
            textfit.say(f"ddp-run: warning: the other nodes' progress records in {self.rd.url}: {exc}",
                        sys.stderr, flush=True)


class Relay:
    """A node other than node 0 under a remote root: mirror this node's quick files every ``every_s``, and copy
    node 0's dump request into the staging folder once this launch has trained a step here (an earlier launch's
    request, not yet removed by node 0, is not this one's)."""

    def __init__(self, rd: RunDir, mirror: Mirror, every_s: float = EVERY_S) -> None:
        self.rd, self.mirror, self.every_s = rd, mirror, every_s
        self.last = float("-inf")
        self.trained = False  # has a rank here finished a step of this launch (then a request is this launch's)
        self.relayed = False

    def tick(self) -> None:
        """Called on the supervisor's tick; acts every ``every_s``."""
        if time.monotonic() - self.last < self.every_s:
            return
        self.last = time.monotonic()
        self.mirror.flush(quick_files(self.rd.local))
        self.trained = self.trained or self._trained()
        if self.relayed or not self.trained:
            return
        with contextlib.suppress(Exception):
            remote = layout.join(self.rd.path, layout.DUMP_REQUEST)
            self.rd.fs.invalidate_cache(layout.join(self.rd.path, layout.STACKS))
            if self.rd.fs.exists(remote):
                local = Path(self.rd.local, layout.DUMP_REQUEST)
                local.parent.mkdir(parents=True, exist_ok=True)
                local.touch()
                self.relayed = True

    def _trained(self) -> bool:
        for path in Path(self.rd.local, layout.PROGRESS).glob("rank*.json"):
            with contextlib.suppress(OSError, ValueError):
                p = json.loads(path.read_text())
                if p.get("step", 0) > p.get("start_step", 0):
                    return True
        return False
