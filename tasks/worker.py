"""One rank's life, however torchrun started it: a fresh interpreter (``python -m ddp_runner.tasks <run dir>``,
tasks/__main__.py) or a fork of the agent's preloaded forkserver (tasks/forked.py).

Reads the resolved config from the run directory (workers never run Hydra), then hands over to the one
training engine. Only the driver creates directories.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import os
import signal
import socket
import sys

from ddp_runner.contract import layout, netbind, osutil
from ddp_runner.tasks.engine import progress, startup, worker_io
from ddp_runner.tasks.engine.diagnostics import termination


def main(run_dir: str | None = None, started: float | None = None) -> int:
    """Run this rank into ``run_dir`` (default: ``DDP_RUNNER_RUN_DIR``); return its exit code. ``started``: when
    its imports began, if not now (Unix seconds)."""
    startup.mark("worker_start", started)
    run_dir = run_dir or os.environ.get(layout.ENV_RUN_DIR)
    if not run_dir:  # `python -m ddp_runner.tasks` with no run directory: one line, not a KeyError
        print(f"ddp_runner.tasks: refused: no run directory: pass it (python -m ddp_runner.tasks RUN_DIR) or set"
              f" {layout.ENV_RUN_DIR}; ddp-run does both", file=sys.stderr, flush=True)
        return layout.EXIT_REFUSED
    local_dir = os.environ.get(layout.ENV_LOCAL_DIR, run_dir)
    rank = int(os.environ.get("RANK", "0"))
    osutil.die_with_parent(signal.SIGKILL)  # torchrun's agent gone: no rank may outlive it
    console = worker_io.redirect_output(local_dir, rank)
    progress.stage(console, "importing torch")  # the driver's bar says what the start-up is doing
    if os.environ.get(layout.ENV_DEBUG):  # before torch is imported: its C++ logs go to the private debug log
        from ddp_runner.tasks.engine.diagnostics import debug

        debug.apply(local_dir, rank)
    if os.environ.get("LOCAL_WORLD_SIZE", "1") != os.environ.get("WORLD_SIZE", "1"):  # several nodes
        node = os.environ.get(layout.ENV_NODE) or os.environ.get("GROUP_RANK")
        print(f"ddp-run: rank {rank} on node {node} (host {socket.gethostname()}, local rank"
              f" {os.environ.get('LOCAL_RANK')}, group rank {os.environ.get('GROUP_RANK')})", flush=True)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        netbind.install()  # rank 0 hosts the job's store itself: on its host's address only
    termination.install()  # on SIGTERM, the checkpoint being written is finished first
    # A crash in native code (SIGSEGV, SIGABRT, …) leaves every thread's Python stack in the rank log.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    # An error record left by an earlier attempt (elastic restart, resume) must not pass for this one's.
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(local_dir, layout.rank_error(rank)))
    try:
        from ddp_runner.tasks.engine.trainer import run

        startup.mark("imports")
        run(run_dir, local_dir, console)
        return 0
    except BaseException as exc:  # noqa: B036 - every failure, KeyboardInterrupt too, is recorded
        worker_io.record_error(local_dir, rank, exc)
        _torchrun_error_file(exc)
        import traceback

        traceback.print_exc()
        return 1


def _torchrun_error_file(exc: BaseException) -> None:
    """Also leave torchrun's own error file (``TORCHELASTIC_ERROR_FILE``, as its ``@record`` would), so that
    torchrun's failure report shows this rank's traceback instead of "To enable traceback see …"."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE") or not isinstance(exc, Exception):
        return
    with contextlib.suppress(Exception):  # its report only; the runner's own record is written above
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)


def fast_exit(code: int) -> None:
    """Exit without the interpreter's module-by-module teardown of torch (~0.7 s per rank).

    Only after a clean finish: the engine has waited for its checkpoint, closed TensorBoard, stopped the
    DataLoader workers and destroyed the process group. Exit handlers still run and streams are flushed.
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def after_failure() -> None:
    """What a rank does after ``main`` returned non-zero, before it exits."""
    # A rank whose collective failed because a peer went away may get here before torchrun's SIGTERM: it
    # finishes (and logs) the checkpoint in flight just as the SIGTERM path would.
    termination.finish_now("stopping after the error")
    # After a failure the trainer is garbage in a reference cycle. Collect it now, while the interpreter is whole:
    # at finalization, the destructor of DDP's Python comm hook would need the GIL and abort the process
    # (SIGABRT instead of exit code 1).
    gc.unfreeze()  # the engine froze the heap after the first step (tasks/engine.py)
    gc.collect()
