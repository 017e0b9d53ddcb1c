"""Which CUDA devices this host shows, without importing torch (the driver must start fast).

Local rank k uses the k-th *visible* device; this module records which physical GPU that is.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from ddp_runner.config.plan import Gpu


def all_gpus() -> list[Gpu]:
    """Every GPU of this host as nvidia-smi lists them (empty without the driver), whatever is visible."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,name,uuid", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        index, name, uuid = (p.strip() for p in line.split(",", 2))
        gpus.append(Gpu(physical_index=int(index), name=name, uuid=uuid))
    return gpus


def select_visible(gpus: list[Gpu], visible: str | None) -> list[Gpu]:
    """Apply a CUDA_VISIBLE_DEVICES value (indices or UUID prefixes, CUDA's rules) to the host's GPUs."""
    if visible is None:
        return list(gpus)
    chosen: list[Gpu] = []
    for item in (v.strip() for v in visible.split(",")):
        if not item:
            break
        if item.lstrip("-").isdigit():
            idx = int(item)
            match = [g for g in gpus if g.physical_index == idx]
        else:
            match = [g for g in gpus if g.uuid.startswith(item) or g.uuid.startswith("GPU-" + item)]
        if not match or match[0] in chosen:
            break  # CUDA stops at the first invalid or repeated entry
        chosen.append(match[0])
    return chosen


def visible_gpus() -> list[Gpu]:
    """The GPUs this process (and so torchrun's workers) can see, in local-rank order."""
    return select_visible(all_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"))
