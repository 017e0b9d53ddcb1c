"""Run a server for as long as another process lives: ``python owned_server.py <owner pid> <command…>``.

A server that every xdist worker of a test session shares must outlive the worker that happened to start it (the
others may still be using it) and end with the session: its owner is the session's controller process. The
command runs in a process group of its own; it is stopped (SIGTERM to that group, SIGKILL 20 s later) when the
owner has gone, or when this process gets SIGTERM. Standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    """Start ``argv[1:]``, watch the process ``argv[0]``; return the server's exit code (0 when stopped here)."""
    owner, command = int(argv[0]), argv[1:]
    server = subprocess.Popen(command, start_new_session=True)

    def stop(*_: object) -> None:
        try:
            os.killpg(server.pid, signal.SIGTERM)  # the server and the workers it started
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        except ProcessLookupError:
            pass
        try:  # whatever of its group outlived it
            os.killpg(server.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while server.poll() is None:
        if not _alive(owner):
            stop()
        time.sleep(POLL_S)
    return server.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
