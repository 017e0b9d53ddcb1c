"""The one registry of launchers (``conf/launcher/<name>.yaml``): ``local``, ``multinode``, ``slurm``,
``kubernetes``. Each implements :class:`~ddp_runner.launch.base.Launcher`; ``agent`` is the torchrun entry they all
start."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_runner.contract.errors import PlanError
from ddp_runner.launch import kubernetes, local, multinode, slurm
from ddp_runner.launch.base import Launcher

LAUNCHERS: dict[str, Launcher] = {"local": local.LAUNCHER, "multinode": multinode.LAUNCHER, "slurm": slurm.LAUNCHER,
                                   "kubernetes": kubernetes.LAUNCHER}


def get(launcher: Mapping[str, Any]) -> Launcher:
    """The launcher a ``launcher`` config group names (PlanError for an unknown one)."""
    name = launcher.get("name", "local")
    if name not in LAUNCHERS:
        raise PlanError("launcher", name, "unknown launcher", f"use launcher={', '.join(LAUNCHERS)}")
    return LAUNCHERS[name]


def launcher_check(launcher: Mapping[str, Any], output_root: str | None = None) -> None:
    """Refuse (PlanError) a launcher config its launcher cannot run (into ``output_root``), before anything
    starts."""
    get(launcher).check(launcher, str(output_root or ""))

