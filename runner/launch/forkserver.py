"""torchrun's agent starts this package's ranks as forks of one server that has imported torch already.

A rank started as a command (torchrun's SubprocessContext) is a fresh interpreter that imports torch and, through
DDP's constructor, torch._dynamo: about 4 CPU-seconds per rank and launch, paid again by every rank of every run.
torchrun also runs a *function* on every rank (MultiprocessContext, through ``torch.multiprocessing`` with start
method ``forkserver``): then the agent imports once per launch (``ddp_runner.tasks.preload``), forks the server from
itself, and every rank is a fork of that server, a single-threaded process that never touched CUDA.

The agent keeps torchrun's own command line and machinery (rendezvous, restarts, health): when the command it is
given is this package's worker (``--no-python <python> -P -u -m ddp_runner.tasks <run dir>``, the one every
launcher writes), the same rank is handed to torchrun as the function ``ddp_runner.tasks.forked.rank``. Any other
command runs as plain torchrun would run it, and ``python -m ddp_runner.tasks <run dir>`` still works on its own.

A launch mechanism, not supervision: it decides how torchrun's agent starts a rank (a fork of a preloaded server
instead of a fresh interpreter) and the worker's command every launcher writes (:func:`worker_tail`); it runs inside
the agent, never in the driver that supervises it, and a rank's stop and end are torchrun's as before.

Standard library only at import: the agent imports torch through the worker's modules (start_server).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

# The worker's command after the interpreter, as every launcher writes it (runner/launch/local.py: worker_tail).
WORKER_MODULE = "ddp_runner.tasks"
WORKER_ARGS = ("-P", "-u", "-m", WORKER_MODULE)
ENTRY = (f"{WORKER_MODULE}.forked", "rank")  # the rank as a function (module, name)
PRELOAD = f"{WORKER_MODULE}.preload"  # what the server imports before it forks the first rank


def worker_tail(run_url: str) -> list[str]:
    """What torchrun runs on every rank: this package's worker, into ``run_url``."""
    return ["--no-python", sys.executable, *WORKER_ARGS, run_url]


def run_dir_of(argv: list[str]) -> str | None:
    """The run directory when ``argv`` (torchrun's arguments) ends with this package's worker, else None."""
    if len(argv) < 7 or argv[-7:] != worker_tail(argv[-1]):
        return None
    return argv[-1]


def start_server() -> None:
    """Import the worker's modules here (torch among them, which this agent imports for itself anyway), then fork
    the forkserver from this process: it starts with every import done, and the ranks are forks of it. It inherits
    the agent's environment and file descriptors as they are now (the ranks set their own variables: torchrun
    hands each its RANK, LOCAL_RANK… and the rank applies them before it runs).

    Where this Python's forkserver is not the one :func:`_fork_server` knows, the server is started as
    multiprocessing starts it (a fresh interpreter that imports the modules while the agent imports torch)."""
    import multiprocessing
    import os
    from multiprocessing import forkserver

    from ddp_runner.contract import layout

    if _forkable(forkserver):
        import tempfile

        # The server gets the environment and temporary folder the agent was given, as a fresh interpreter would:
        # not what the imports wrote into them here (inductor writes its default cache folder, under the
        # temporary folder, into the environment), nor the agent's private temporary folder.
        given, private = dict(os.environ), tempfile.tempdir
        os.environ[layout.ENV_FORKSERVER] = layout.FORKSERVER_AGENT  # tasks/preload.py pops it
        tempfile.tempdir = None
        try:
            preload = importlib.import_module(PRELOAD)
        finally:
            tempfile.tempdir = private
        _fork_server(forkserver, preload.become_server, given)
        return
    multiprocessing.get_context("forkserver").set_forkserver_preload([PRELOAD])
    os.environ[layout.ENV_FORKSERVER] = layout.FORKSERVER_SPAWNED  # the server's alone (tasks/preload.py)
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(layout.ENV_FORKSERVER, None)


# The signature of multiprocessing.forkserver.main that _fork_server calls (Python 3.9-3.13; 3.14 adds a key).
_MAIN_PARAMETERS = ("listener_fd", "alive_r", "preload", "main_path", "sys_path")


def _forkable(forkserver: Any) -> bool:
    """Whether this Python's forkserver is the one :func:`_fork_server` reproduces."""
    import inspect

    server = getattr(forkserver, "_forkserver", None)
    try:
        parameters = tuple(inspect.signature(forkserver.main).parameters)
    except (TypeError, ValueError):
        return False
    return parameters == _MAIN_PARAMETERS and server is not None and server._forkserver_pid is None and all(
        hasattr(server, a) for a in ("_forkserver_address", "_forkserver_alive_fd", "_lock"))


def _fork_server(forkserver: Any, become_server: Any, environ: dict[str, str]) -> None:
    """What ``forkserver.ensure_running()`` does, with ``os.fork()`` in place of a fresh interpreter: the listening
    socket, the pipe whose closing tells the server that this process is gone, and the server's loop, in
    ``environ``."""
    import os
    import socket
    import sys
    import tempfile
    import traceback
    from multiprocessing import connection, resource_tracker, util

    server = forkserver._forkserver
    # No lock is held across the fork: the server and every rank would inherit it locked (a rank's own use of the
    # forkserver, a DataLoader's workers, then waits forever). This process has no other thread yet to race with.
    resource_tracker.ensure_running()
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the server: never returns into the agent's code
            code = 1
            try:
                os.close(alive_w)
                os.environ.clear()
                os.environ.update(environ)
                tempfile.tempdir = None  # not the agent's private folder: the user's TMPDIR (and compile caches)
                become_server()
                forkserver.main(listener.fileno(), alive_r, [])
            except SystemExit as exc:  # its loop ends so when the agent is gone
                code = exc.code if isinstance(exc.code, int) else 0
            except BaseException:  # noqa: BLE001 - said on stderr; the ranks then fail to start
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        os.close(alive_r)
    with server._lock:
        server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid


def stop_server(wait_s: float = 10.0) -> None:
    """At the agent's end: close its end of the server's pipe and reap the server (its CPU time, and its ranks',
    then count in this process's children as a command's ranks would), then run multiprocessing's own clean-up
    (its temporary folder, which lies inside the agent's). The ranks closed their copies of the pipe, so the server
    ends at once; should one not have (a rank stuck before it could), the agent does not wait past ``wait_s``."""
    import os
    import time
    from multiprocessing import forkserver, util

    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        os.close(server._forkserver_alive_fd)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and os.waitpid(server._forkserver_pid, os.WNOHANG)[0] == 0:
            time.sleep(0.02)
        server._forkserver_pid = server._forkserver_alive_fd = None
    util._run_finalizers()


def install() -> None:
    """Make torchrun (imported from here on) run this package's worker as forked ranks; other commands as ever."""
    import torch.distributed.elastic.multiprocessing as elastic_mp
    import torch.distributed.run as torchrun

    original = torchrun.config_from_args

    def config_from_args(args: Any) -> tuple[Any, Any, list[str]]:
        config, cmd, cmd_args = original(args)
        if cmd != sys.executable or tuple(cmd_args[:-1]) != WORKER_ARGS or len(cmd_args) != len(WORKER_ARGS) + 1:
            return config, cmd, cmd_args
        config.start_method = "forkserver"
        entry = getattr(importlib.import_module(ENTRY[0]), ENTRY[1])
        entry.__name__ = WORKER_MODULE  # torchrun's failure report names it as it named the command
        return config, entry, [cmd_args[-1]]

    torchrun.config_from_args = config_from_args
    elastic_mp.MultiprocessContext = _every_rank_context(elastic_mp.MultiprocessContext)


def _every_rank_context(base: type) -> type:
    """torchrun's MultiprocessContext, reporting every rank that failed as its SubprocessContext does.

    On a failure MultiprocessContext stops the other ranks (SIGTERM; SIGKILL after 30 s) but reports only the
    first; the driver reads each rank's exit code from torchrun's failure report (runner/supervise/finalize.py), so
    the ranks that the stop ended with a non-zero code are added, as SubprocessContext would list them."""
    import logging

    from torch.distributed.elastic.multiprocessing import api

    logging.getLogger(api.__name__).addFilter(_without_join_traceback)

    class EveryRankContext(base):  # type: ignore[misc, valid-type]
        def _poll(self) -> Any:
            result = super()._poll()
            if result is None or not result.failures or self._pc is None:
                return result
            for local_rank, proc in enumerate(self._pc.processes):
                code = proc.exitcode
                if local_rank not in result.failures and code not in (0, None):
                    result.failures[local_rank] = stopped_rank_failure(local_rank, proc.pid, code,
                                                                       self.error_files[local_rank])
            return result

    EveryRankContext.__name__ = EveryRankContext.__qualname__ = base.__name__
    return EveryRankContext


def stopped_rank_failure(local_rank: int, pid: int, code: int, error_file: str) -> Any:
    """torchrun's ProcessFailure of a rank that the stop ended. Its error file may be half written (the stop came
    while the rank recorded its own error), and torch's parser raises on that, which would end the agent, and with
    it any elastic restart: such a rank is reported as one without an error file."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    try:
        return ProcessFailure(local_rank=local_rank, pid=pid, exitcode=code, error_file=error_file)
    except ValueError:  # json.JSONDecodeError
        return ProcessFailure(local_rank=local_rank, pid=pid, exitcode=code, error_file="")


def _without_join_traceback(record: Any) -> bool:
    """MultiprocessContext logs a rank's failure with the traceback of torch's own join (which says nothing the
    line does not); SubprocessContext logs the line alone, and so does this agent."""
    if str(record.msg).startswith("failed (exitcode"):
        record.exc_info, record.exc_text = None, None
    return True
