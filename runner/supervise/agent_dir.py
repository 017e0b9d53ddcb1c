"""torchrun's agent's private temporary folder: the agent (runner/launch/agent.py) makes it and removes it when it
ends; the supervisor removes it should the agent be killed. Standard library only: the agent imports this first."""

from __future__ import annotations

import os
import tempfile

# A Unix socket's path holds at most 107 bytes on Linux; the forkserver's listener goes in
# <this folder>/pymp-XXXXXXXX/listener-XXXXXXXX.
_SOCKET_PATH_MAX = 107
_SOCKET_SUFFIX = len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def temp_dir(agent_pid: int) -> str:
    """The agent's private temporary folder: torchrun makes a ``torchelastic_*`` folder of logs in the temporary
    folder at every launch and never removes it (hundreds pile up); here it goes inside this one, which the agent
    removes when it ends (and the driver, should the agent be killed). Under a temporary folder whose path is too
    long for the forkserver's Unix socket (a deep TMPDIR), it goes in ``/tmp``, as Python 3.12's multiprocessing
    does with its own."""
    name = f"ddp-run-agent-{agent_pid}"
    base = tempfile.gettempdir()
    if len(os.path.join(base, name)) + _SOCKET_SUFFIX > _SOCKET_PATH_MAX and os.access("/tmp", os.W_OK):
        base = "/tmp"
    return os.path.join(base, name)
