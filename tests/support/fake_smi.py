"""A fake ``nvidia-smi`` first on PATH (two H200s on NVLink), for the ddp-doctor and device-mapping tests of every
tier: what it prints for ``-L``, the visible-device query and ``topo -m``."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

UUID0 = "GPU-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
UUID1 = "GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0"

SMI_L = f"GPU 0: NVIDIA H200 (UUID: {UUID0})\nGPU 1: NVIDIA H200 (UUID: {UUID1})\n"
SMI_QUERY = f"0, NVIDIA H200, {UUID0}\n1, NVIDIA H200, {UUID1}\n"
# As nvidia-smi 580 prints it: tab-separated, underlined header, legend after the matrix.
TOPO_NVLINK = ("\x1b[4m\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
               "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
               "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n\n"
               "Legend:\n\n  X    = Self\n"
               "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes "
               "(e.g., QPI/UPI)\n"
               "  PIX  = Connection traversing at most a single PCIe bridge\n"
               "  NV#  = Connection traversing a bonded set of # NVLinks\n")


def _escaped(text: str) -> str:
    """``text`` as printf's %b argument on one line (tabs, newlines and the escape byte spelled out)."""
    return text.replace("\t", "\\t").replace("\n", "\\n").replace("\x1b", "\\033")


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``nvidia-smi`` (two H200s on NVLink) first on PATH; FAKE_SMI_TOPO_RESTRICTED=1 makes ``topo -m``
    fail as it does in some containers."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    restricted = 'echo "Failed to run topology: Insufficient Permissions" >&2; exit 4'  # as some containers answer
    smi.write_text("\n".join([
        "#!/bin/sh",
        'case "$*" in',
        f"  -L) printf '%b' '{_escaped(SMI_L)}' ;;",
        f"  '--query-gpu=index,name,uuid --format=csv,noheader') printf '%b' '{_escaped(SMI_QUERY)}' ;;",
        "  '--query-gpu=memory.total --format=csv,noheader,nounits -i '*) echo 143771 ;;",
        f"  'topo -m') if [ -n \"$FAKE_SMI_TOPO_RESTRICTED\" ]; then {restricted}; fi",
        f"    printf '%b' '{_escaped(TOPO_NVLINK)}' ;;",
        '  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;',
        "esac", ""]))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("FAKE_SMI_TOPO_RESTRICTED", raising=False)
    return smi


def check_named(report: dict, name: str) -> dict:
    """The check called ``name`` in a ddp-doctor report."""
    return next(c for c in report["checks"] if c["name"] == name)
