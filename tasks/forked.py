"""A rank started as a fork of the agent's forkserver (runner/launch/forkserver.py): torchrun's MultiprocessContext
calls :func:`rank` in a child of a server that has imported torch and the engine (tasks/preload.py).

The same life as a rank started as ``python -m ddp_runner.tasks <run dir>`` (tasks/worker.py), with what a fresh
interpreter would have had: the rank dies with its parent, as there; its variables (RANK, LOCAL_RANK, …, set by
torchrun before this runs) rule what torch read from the server's environment at import (the intra-op threads);
module state the server computed at import is renewed. The exit code is the same: 0 returned (torchrun collects
it and the process ends without the interpreter's teardown), a failure's code through ``sys.exit``.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time

from ddp_runner.contract import layout, osutil
from ddp_runner.tasks import worker
from ddp_runner.tasks.engine.stop import signals


def rank(run_url: str) -> int:
    """Run this rank into ``run_url``: 0 on success; a failure exits with the rank's code."""
    _own_process(run_url)
    code = worker.main(run_url, started=_imports_began())
    if code == 0:
        _end()
        if signals.requested():
            _hand_over_and_exit(0)
        return 0
    worker.after_failure()
    _end()
    sys.exit(code)


def _own_process(run_url: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server ignores it (tasks/preload.py); a rank never does
    osutil.die_with_parent(signal.SIGKILL)  # the server; armed while the agent's pipe (below) keeps it alive
    # Every fork inherits the write end of the pipe whose closing tells the server that the agent is gone. A rank
    # that kept it would keep the server, and so itself, alive after the agent was killed.
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    sys.argv = [os.path.join(os.path.dirname(worker.__file__), "__main__.py"), run_url]  # as `-m ddp_runner.tasks`
    # multiprocessing's default start method, as a fresh interpreter has it: torchrun's forkserver was made this
    # process's default, and its DataLoader workers would then start through a forkserver of their own (a new
    # interpreter per rank) instead of as forks of the rank.
    import multiprocessing

    multiprocessing.set_start_method(None, force=True)
    osutil.set_process_name(f"ddp-rank{os.environ.get('RANK', '')}")  # ps/top: not the server's command line
    _threads_from_env()
    from ddp_runner.tasks.engine.diagnostics import faults, heartbeat

    faults.use(faults.Faults.from_env(os.environ))  # read at import: from the server's environment
    heartbeat.phase("startup")  # its clock started at the server's import


def _imports_began() -> float | None:
    """The start-up breakdown's ``imports`` part is the server's import time, as this rank's own would have been:
    it ends now, when the rank starts with its imports done (the agent's part is the rest)."""
    preload = sys.modules.get(f"{__package__}.preload")
    if preload is None:
        return None
    launched = float(os.environ.get(layout.ENV_LAUNCH_T) or 0)  # the parts never overlap
    return max(launched, time.time() - (preload.DONE - preload.STARTED))


def _threads_from_env() -> None:
    """OpenMP read OMP_NUM_THREADS when the server imported torch; this rank's value rules."""
    wanted = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and wanted.isdigit() and int(wanted) > 0 and torch.get_num_threads() != int(wanted):
        torch.set_num_threads(int(wanted))


def _hand_over_and_exit(result: int) -> None:
    """A rank stopped by a signal ends once its result is handed over, as one started as a command ends with its
    script. torchrun releases a rank it runs as a function only after reading its result, and it does not read it
    while it shuts down (its SIGTERM is what stopped this rank, or came with it): it waits 30 s for the rank to
    end, then SIGKILLs it, and every Ctrl-C took that long after the checkpoint on stop was committed. The result
    goes into the queue torch's wrapper would put it in (``_wrap`` in
    torch/distributed/elastic/multiprocessing/api.py), then the process ends; where that wrapper is not found (a
    torch that starts functions otherwise), the rank returns as before."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "_wrap" and "ret_val_" in frame.f_locals
                                     and "queue_finished_reading_event" in frame.f_locals):
        frame = frame.f_back
    if frame is None:
        return
    frame.f_locals["ret_val_"].put(result)
    os._exit(0)


def _end() -> None:
    """What a fresh interpreter's exit would do and multiprocessing's does not: exit handlers, flushed streams."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
