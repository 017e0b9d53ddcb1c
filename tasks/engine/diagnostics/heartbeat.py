"""Each rank's progress for the driver's hang watchdog, and the hooks that let it read stacks.

The training loop marks where it is with :func:`phase` (``data``, ``forward_backward``, ``sync``, ``optimizer``,
``step_end``, ``log``, ``validate``, ``checkpoint``, ``finish``, ``done``) and :func:`step`. Those calls only
assign a few module globals (well under a microsecond): the file ``logs/progress/rank<R>.json`` is rewritten by a
background thread at most once a second, and only when something changed (a rename, no fsync). A rank that stops
making progress stops changing the file; a stopped or stuck process cannot fake progress, because the thread
only writes what the training loop last set.

:func:`start` also registers faulthandler on SIGUSR1 (every thread's Python stack into ``logs/stacks/rank<R>.txt``;
a C-level handler, so it works while the main thread is blocked in a collective) and, on SIGTERM, records the
phase ``terminated`` (so the driver tells a rank stopped by torchrun from one that died on its own). On NCCL the
thread also dumps NCCL's flight recorder when the driver asks for it (best effort: private torch API).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import socket
import threading
import time
from typing import IO, Any

from ddp_runner.contract import layout
from ddp_runner.tasks.engine.stop import signals

WRITE_EVERY_S = 1.0

_step = 0
_phase = "startup"
_since = time.time()
_seq = 0
_writer: _Writer | None = None


def phase(name: str) -> None:
    """This rank enters phase ``name`` (cheap: no I/O here)."""
    global _phase, _since, _seq
    _phase, _since, _seq = name, time.time(), _seq + 1


def tick() -> None:
    """Progress inside the current phase (one validation batch done): long phases are not taken for hangs."""
    global _seq
    _seq += 1


def step(done: int) -> None:
    """``done`` optimizer steps are complete (phase ``step_end`` until the next one is named)."""
    global _step, _phase, _since, _seq
    _step, _phase, _since, _seq = done, "step_end", time.time(), _seq + 1


def snapshot() -> dict[str, Any]:
    """Where this rank stands now."""
    return {"step": _step, "phase": _phase, "since": _since, "seq": _seq}


class _Writer(threading.Thread):
    def __init__(self, local_dir: str, rank: int, start_step: int, nccl: bool) -> None:
        super().__init__(name="progress-writer", daemon=True)
        self.path = os.path.join(local_dir, layout.rank_progress(rank))
        self.request = os.path.join(local_dir, layout.DUMP_REQUEST)
        self.nccl_path = os.path.join(local_dir, layout.rank_stack(rank, "nccl"))
        self.base = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(),
                     "main_thread": threading.main_thread().ident,
                     "start_step": start_step}
        self.nccl, self.dumped = nccl, False
        self.written = -1
        self.stop = threading.Event()

    def write(self) -> None:
        snap = snapshot()
        if snap["seq"] == self.written:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:  # no fsync: a lost update after a machine crash does not matter here
            json.dump({**self.base, **snap}, f)
        os.replace(tmp, self.path)
        self.written = snap["seq"]

    def run(self) -> None:
        while not self.stop.wait(WRITE_EVERY_S):
            with contextlib.suppress(OSError):
                self.write()
            if not self.dumped and os.path.exists(self.request):
                self.dumped = True
                _ensure_stacks()
                if self.nccl:
                    _dump_nccl_trace(self.nccl_path)


def _ensure_stacks() -> None:
    """Write every thread's stack from this thread if the SIGUSR1 dump left the file empty (seen on NCCL runs: a
    rank had either its stacks or its flight recorder on disk, never both)."""
    f = _stack_file
    if f is None:
        return
    with contextlib.suppress(OSError, ValueError):
        if os.fstat(f.fileno()).st_size == 0:
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.flush()


def _dump_nccl_trace(path: str) -> None:
    """NCCL's flight recorder (needs its buffer size > 0: the driver sets it on NCCL runs)."""
    try:
        import torch

        data = torch._C._distributed_c10d._dump_nccl_trace()  # private API: absent in some builds
        with open(path, "wb") as f:
            f.write(data)
    except Exception as exc:  # noqa: BLE001 - best effort: say why in the rank log
        print(f"watchdog: NCCL flight recorder not saved: {type(exc).__name__}: {exc}", flush=True)


_stack_file: IO[str] | None = None


def start(local_dir: str, rank: int, start_step: int, enabled: bool, nccl: bool = False) -> None:
    """Register the stack dump on SIGUSR1 and, when ``enabled`` (``watchdog.timeout_s > 0``), start the writer.

    ``start_step``: optimizer steps done before this launch (the driver judges a rank only once it has done one
    step of its own: start-up and compilation can take minutes).
    """
    global _writer, _stack_file, _step
    _step = start_step
    signals.track_steps(lambda: _step)
    with contextlib.suppress(OSError, ValueError):
        _stack_file = open(os.path.join(local_dir, layout.rank_stack(rank)), "w")
        faulthandler.register(signal.SIGUSR1, file=_stack_file, all_threads=True, chain=False)
    if not enabled or _writer is not None:
        return
    signals.on_terminate(_terminated)
    _writer = _Writer(local_dir, rank, start_step, nccl)
    with contextlib.suppress(OSError):
        _writer.write()  # at once: the driver learns this rank's pid
    _writer.start()


def _terminated(_timeout_s: float, why: str) -> None:
    if why == "SIGTERM":  # not a rank ending after its own error (signals.finish_now)
        phase("terminated")
        flush()


def flush() -> None:
    """Write the current state now (the end of training, or a SIGTERM)."""
    if _writer is not None:
        with contextlib.suppress(OSError):
            _writer.write()


def stop() -> None:
    """Write the last state and stop the writer; unregister the stack dump."""
    global _writer
    flush()
    if _writer is not None:
        _writer.stop.set()
        _writer = None
    with contextlib.suppress(Exception):
        faulthandler.unregister(signal.SIGUSR1)
