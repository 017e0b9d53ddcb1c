"""Compiled bytecode for torch in the processes the driver starts, where the installed torch has none.

Some images ship torch without ``__pycache__`` and set ``PYTHONDONTWRITEBYTECODE``, so every process that imports
torch (the driver's probe, torchrun's agent, every rank, inductor's compile workers) compiles its thousands of
modules from source again: seconds per process. When torch's own ``__init__`` has no bytecode beside it, the
driver's children keep theirs in one cache per user (``~/.cache/ddp-runner/pycache``, through Python's
``PYTHONPYCACHEPREFIX``): the first process fills it, the others read it. Source trees are never written to. A
``PYTHONPYCACHEPREFIX`` the user set is kept as it is.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from functools import lru_cache

CACHE = os.path.join("~", ".cache", "ddp-runner", "pycache")
ENV_PREFIX = "PYTHONPYCACHEPREFIX"
ENV_DONT_WRITE = "PYTHONDONTWRITEBYTECODE"


@lru_cache(maxsize=8)
def lacks_bytecode(package: str = "torch") -> bool:
    """Whether ``package`` is installed without compiled bytecode beside its source (found without importing it)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    return not os.path.exists(importlib.util.cache_from_source(spec.origin))


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a child process that imports torch: with the bytecode cache where torch has none."""
    out = dict(env)
    if out.get(ENV_PREFIX) or not lacks_bytecode():
        return out
    out[ENV_PREFIX] = os.path.expanduser(CACHE)
    out.pop(ENV_DONT_WRITE, None)  # written to the cache only, never beside the sources
    return out
