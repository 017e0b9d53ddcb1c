"""Imported once per launch by torchrun's agent, which then forks the server that forks the ranks
(runner/launch/forkserver.py): what every rank would otherwise import itself, about 4 CPU-seconds each (torch, and
torch._dynamo, which DDP's constructor imports), and the engine. The agent imports torch for itself anyway; the
server, a fork of it, imports nothing more. (Where Python's forkserver differs from the one that fork relies on,
the server is started as multiprocessing starts it, a fresh interpreter that imports this module.)

Importing is all it does. Nothing imported here may initialise CUDA: a CUDA context, or the CUDA driver that a
device count or ``torch.cuda.is_available()`` initialises, does not survive a fork, and every rank on a GPU host
would fail ("Cannot re-initialize CUDA in forked subprocess"); the ranks choose their devices (and read
CUDA_VISIBLE_DEVICES) after the fork. Nor may it start a thread or run an OpenMP region (a fork copies only the
calling thread; libgomp's thread pool does not survive one). tests/integration/test_forked_ranks.py checks both.
Module state computed at import from the clock or the environment is the server's; tasks/forked.py renews it in
each rank.

The rest prepares the server for forking, in the server alone (:func:`become_server` in the forked server; at
import in a spawned one, which ``DDP_RUNNER_FORKSERVER=1`` marks and its ranks do not inherit): a test that imports
this module gets the imports only.

An import that fails here is left to the rank, which imports the module again and reports the error in its own
log, as a rank started as a command would.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import signal
import time

from ddp_runner.contract import layout, osutil

STARTED = time.time()  # the imports' wall-clock, a forked rank's ``imports`` start-up part (tasks/forked.py)

MODULES = ("torch", "torch._dynamo", "torch._dynamo.polyfills.loader", "torch.nn.parallel",
           "ddp_runner.tasks.engine.trainer", "ddp_runner.tasks.engine.strategy.ddp", "ddp_runner.tasks.forked")


def _end_server() -> None:
    """The server's exit (the agent has gone): without the interpreter's module-by-module teardown of torch
    (~0.8 CPU-seconds). A rank inherits this handler and runs it as a no-op."""
    if os.getpid() == _SERVER:
        os._exit(0)


def become_server() -> None:
    """In the server that the agent forked after importing this module: prepare it for forking ranks (the
    imports are done; :func:`_end_server` applies to this process, not the agent)."""
    global _SERVER
    _SERVER = os.getpid()
    _prepare_server()


def _prepare_server() -> None:
    # A SIGTERM to the whole process group or Slurm step (scancel) is for the agent and the ranks, which save a
    # checkpoint on it: the server's death would SIGKILL the ranks (their parent-death signal) before they could.
    # It still ends when the agent does (its pipe closes). A rank takes SIGTERM's default back first
    # (tasks/forked.py).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # What is imported now lives as long as every rank: out of the collector's reach, so that a rank's collections
    # neither walk it nor write to its pages (each write would copy a page of the shared memory into that rank).
    gc.freeze()
    atexit.register(_end_server)  # last registered, first run


def _tell_the_bar() -> None:
    """Under the driver's live bar, say what the start-up is doing while the agent (or a spawned server) imports
    for every rank (a forked rank 0 starts with its imports done)."""
    path = os.environ.get(layout.ENV_CONSOLE_RECORDS)
    local = os.environ.get(layout.ENV_LOCAL_DIR) or os.environ.get(layout.ENV_RUN_DIR)
    if not path or not (os.path.isabs(path) or local):
        return
    from ddp_runner.tasks.engine.reporting.progress import RecordConsole, stage

    console = RecordConsole(path if os.path.isabs(path) else os.path.join(str(local), path))
    stage(console, "importing torch")
    console.close()


_ROLE = os.environ.pop(layout.ENV_FORKSERVER, None)
_IS_SERVER = _ROLE == layout.FORKSERVER_SPAWNED
if _ROLE in (layout.FORKSERVER_SPAWNED, layout.FORKSERVER_AGENT):
    try:
        _tell_the_bar()
    except OSError:  # the bar only
        pass
with osutil.lasting_imports():
    for _name in MODULES:
        try:
            importlib.import_module(_name)
        except Exception:  # noqa: BLE001, S112 - the rank imports it again and reports the error itself
            continue
DONE = time.time()
_SERVER = os.getpid()
if _IS_SERVER:
    _prepare_server()
