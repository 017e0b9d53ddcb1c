"""The launch command for a plan, by launcher (``conf/launcher/``), and the supervisor that runs it.

The launchers live in ``runner/launch/`` (local, multinode, slurm); supervising torchrun in
``runner/launch/supervisor.py``. This module keeps the one name the driver calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.config.plan import Plan
from runner.contract.layout import SAFE_ENV
from runner.launch import local, multinode, slurm
from runner.launch.supervisor import GRACE_S, Supervisor, worker_env

__all__ = ["GRACE_S", "SAFE_ENV", "Supervisor", "torchrun_command", "worker_env"]


def torchrun_command(plan: Plan, launcher: Mapping[str, Any], run_url: str) -> list[str]:
    """The torchrun invocation this host runs for ``plan``; the worker entry is ``python -P -m tasks <run dir>``.

    ``-P`` keeps the working directory off the workers' ``sys.path``: a stray ``tasks.py`` or ``runner.py`` where
    the user runs ddp-run cannot shadow this package (a task module found there comes through
    ``layout.ENV_TASK_PATH``, appended after the installed packages). Under Slurm this is the command each node's
    srun task runs (``runner/launch/slurm.py``).
    """
    name = launcher.get("name", "local")
    if name == "local":
        return local.command(plan, launcher, run_url)
    if name == "multinode":
        return multinode.command(plan, launcher, run_url)
    if name == "slurm":
        return slurm.command(plan, launcher, run_url)
    raise ValueError(f"launcher={name!r}: unknown launcher. Fix: use launcher=local, multinode or slurm")
