"""One module per launcher (``conf/launcher/<name>.yaml``): local, multinode, slurm; ``agent`` is the torchrun
entry they all start."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def launcher_check(launcher: Mapping[str, Any], output_root: str | None = None) -> None:
    """Refuse (PlanError) a launcher config its launcher cannot run (into ``output_root``), before anything
    starts."""
    if launcher.get("name") == "multinode":
        from runner.launch import multinode

        multinode.check(launcher)
    elif launcher.get("name") == "slurm":
        from runner.launch import slurm

        slurm.check(launcher, output_root)
