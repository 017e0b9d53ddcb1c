"""The driver's heartbeat in run.json, refreshed while it supervises (readers on other hosts judge liveness by it)."""

from __future__ import annotations

import sys
import time
from typing import Any

from ddp_runner.contract import layout
from ddp_runner.rundir.run_dir import RunDir
from ddp_runner.rundir.status import heartbeat_every_s


class Heartbeat:
    """Refreshes the driver's heartbeat in run.json while it supervises (readers on other hosts rely on it).

    Called from the supervisor's tick (every ~0.5 s) but writes at most every ``every_s``: one small atomic
    write, no measurable cost. A failed write only warns (once): the run itself is not at stake.
    """

    def __init__(self, rd: RunDir, manifest: dict[str, Any], every_s: float | None = None) -> None:
        self.rd, self.manifest = rd, manifest
        self.every_s = heartbeat_every_s() if every_s is None else every_s
        self.last = time.monotonic()
        self.warned = False

    def tick(self) -> None:
        """Write a fresh heartbeat if ``every_s`` has passed since the last one."""
        if time.monotonic() - self.last < self.every_s:
            return
        self.last = time.monotonic()
        self.manifest["driver"]["heartbeat"] = time.time()
        try:
            self.rd.write_json(layout.MANIFEST, self.manifest)
        except Exception as exc:  # noqa: BLE001 - a full disk or a store blip must not stop training
            if not self.warned:
                print(f"ddp-run: warning: could not refresh the heartbeat in {layout.MANIFEST}: {exc}",
                      file=sys.stderr, flush=True)
                self.warned = True
