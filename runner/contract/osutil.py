"""Small operating-system helpers both sides use (standard library only: workers import this at start-up).

- :func:`atomic_write`: a local file appears whole or not at all (readers never see half of it).
- :func:`die_with_parent`: a child process is signalled when its parent dies, so none is orphaned.
- :func:`lasting_imports`: imports whose objects live as long as the process, out of the cyclic collector's way.
- :func:`handle_signals` / :func:`restore_signals`: a block's own signal handlers, and the previous ones put back.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import os
import signal
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def current_umask() -> int:
    """This process's umask, read without changing it (``os.umask`` can only be read by setting it, which races
    with other threads creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def atomic_write(path: str | os.PathLike[str], data: str | bytes, mode: int | None = None) -> None:
    """Write ``data`` to the local file ``path`` through a temporary sibling, fsync it and rename it into place.

    ``mode`` is applied before the rename (a temporary file is created owner-only); by default the mode a plain
    ``open`` would give, 0o666 less the umask. Nothing is left behind if the write fails.
    """
    if mode is None:
        mode = 0o666 & ~current_umask()
    path = os.fspath(path)
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(dir=directory or ".", prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def lasting_imports() -> Iterator[None]:
    """Import inside: the cyclic collector is off meanwhile, and what was made inside is frozen out of its reach
    afterwards (``gc.freeze()``), then the collector is as it was. Torch's imports make hundreds of thousands of
    objects that live as long as the process; each pass of the collector would walk them all again, during the
    imports and after them (measured: BENCHMARKS.md)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if collecting:
            gc.enable()


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies (``PR_SET_PDEATHSIG``).

    Returns False where that is not available (not Linux). Exits at once if the parent is already gone (the
    process was re-parented to init before the request took effect).
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        return False
    if os.getppid() == 1:
        os._exit(1)
    return True


def descendant_pids(pid: int) -> list[int] | None:
    """Every live descendant of ``pid`` (children, their children...), read from Linux's per-thread ``children``
    lists along the tree only: a handful of reads, where psutil's ``children(recursive=True)`` reads the status of
    every process on the host (thousands on a busy node; the driver asks twice a second). None where the kernel
    has no such lists (then ask psutil); [] once ``pid`` is gone. A process that forks or ends during the walk may
    be missed, as with psutil."""
    if not _children_lists():
        return None
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:  # ended meanwhile
            continue
        for tid in threads:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            found.extend(kids)
            todo.extend(kids)
    return found


@functools.cache
def _children_lists() -> bool:
    """Whether this kernel keeps ``/proc/<pid>/task/<tid>/children`` (CONFIG_PROC_CHILDREN)."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def set_process_name(name: str) -> None:
    """This process's name as ps, top and psutil's ``name()`` show it (Linux: ``PR_SET_NAME``, 15 bytes at most);
    nothing elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def handle_signals(signals: Iterable[int], handler: Any) -> dict[int, Any]:
    """Handle every one of ``signals`` with ``handler`` and return the handlers they had, for
    :func:`restore_signals`: whoever takes a signal for a while (a sweep, a supervised run, a followed Slurm job)
    gives it back as it found it. Python sets handlers on the main thread only (elsewhere: ValueError)."""
    return {s: signal.signal(s, handler) for s in signals}


def restore_signals(old: dict[int, Any]) -> None:
    """Put back the handlers :func:`handle_signals` replaced (one set outside Python reads None, and Python cannot
    set it again: that signal keeps the block's handler)."""
    for s, h in old.items():
        if h is not None:
            signal.signal(s, h)
