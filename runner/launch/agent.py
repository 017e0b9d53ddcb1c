"""torchrun's agent with its TCPStore servers bound to their host's address: ``python -m ddp_runner.launch.agent
<torchrun arguments>``.

The same program as ``python -m torch.distributed.run`` (every option is torchrun's own); only the stores it
creates listen on one address instead of every interface (``runner/contract/netbind.py``), and this package's
worker runs as forks of one server, itself a fork of this process after it imported torch and the engine
(``runner/launch/forkserver.py``).
"""

from __future__ import annotations

import os
import sys

from ddp_runner.contract import console_streams, layout, netbind, osutil
from ddp_runner.launch import forkserver
from ddp_runner.supervise import exit_barrier
from ddp_runner.supervise.agent_dir import temp_dir


def _private_debug_output() -> None:
    """debug=true: the agent's C++ output (c10d's store ports and rendezvous keys, at TORCH_CPP_LOG_LEVEL=INFO)
    goes to the owner-only ``logs/debug/agent.log``, not to logs/torchrun.log (mode 644), which keeps torchrun's
    Python messages (as the workers do, tasks/engine/diagnostics/debug.py). Before torch is imported."""
    local = os.environ.get(layout.ENV_LOCAL_DIR)
    if not os.environ.get(layout.ENV_DEBUG) or not local:
        return
    directory = os.path.join(local, layout.DEBUG_LOGS)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    node = os.environ.get(layout.ENV_NODE)  # several nodes share a run directory: one file each
    name = f"agent.node{node}.log" if node else "agent.log"
    fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    sys.stderr.flush()
    python_stderr = os.dup(2)  # logs/torchrun.log
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = os.fdopen(python_stderr, "w", buffering=1)


def _cheap_caller_names() -> None:
    """torchrun's rendezvous names each of its events after the method that records it through
    ``inspect.stack()``, which reads the source of every frame and searches ``sys.modules`` (thousands of modules
    with torch) for each, a noticeable part of every launch's CPU time. The same name, read from the frame
    itself."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    def get_method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name
        except ValueError:  # fewer frames than that
            return "no_method_name"

    if callable(getattr(dynamic_rendezvous, "get_method_name", None)):
        dynamic_rendezvous.get_method_name = get_method_name


def missing_run_dir(argv: list[str], environ: dict[str, str] | os._Environ[str]) -> str | None:
    """Why this package's worker cannot start (its run directory is named nowhere: a dry run's command pasted with
    RUN_DIR unset), in one line; None when it can, or the command is another one."""
    run_dir = forkserver.run_dir_of(argv)
    if run_dir is None or run_dir.strip() or environ.get(layout.ENV_RUN_DIR, "").strip():
        return None
    return (f"no run directory: the worker's argument is empty and {layout.ENV_RUN_DIR} is unset. Fix: set RUN_DIR "
            "to a run directory ddp-run made (config.yaml, run.json), or launch with ddp-run itself")


def main() -> None:
    """Bind the stores, then hand over to torchrun's own main (it reads ``sys.argv``)."""
    console_streams.guard()  # its stdout is the user's console: a closed pipe never ends the run
    import shutil
    import tempfile

    if (why := missing_run_dir(sys.argv[1:], os.environ)) is not None:
        print(f"ddp-run agent: refused: {why}", file=sys.stderr)  # once, not a KeyError in every rank
        sys.exit(layout.EXIT_REFUSED)
    _private_debug_output()  # first: binding the stores below imports torch
    mine = temp_dir(os.getpid())
    os.makedirs(mine, mode=0o700, exist_ok=True)
    # This process only (the forkserver's socket goes here too): the workers keep the user's TMPDIR (and compile
    # caches).
    tempfile.tempdir = mine
    try:
        with osutil.lasting_imports():  # torch's, and the engine's for the ranks
            if forkserver.run_dir_of(sys.argv[1:]) is not None:
                forkserver.start_server()  # imports torch and the engine here once, then forks the ranks' server
            netbind.install()
            forkserver.install()
            from torch.distributed.run import main as torchrun_main

            _cheap_caller_names()
            exit_barrier.install()  # a node stopped by a signal does not keep the others waiting 300 s
        torchrun_main()
    finally:
        forkserver.stop_server()
        shutil.rmtree(mine, ignore_errors=True)
    # Done well: end without the interpreter's module-by-module teardown of torch (~0.4 CPU-seconds). A failure
    # raises above and ends the ordinary way (torchrun's report, exit code 1).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
