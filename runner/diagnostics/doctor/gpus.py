"""ddp-doctor's GPU checks: nvidia-smi's devices and topology (parsed as pure functions) and the visible-device
mapping (local rank → physical GPU) that CUDA_VISIBLE_DEVICES gives."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from ddp_runner.config.devices import all_gpus, select_visible
from ddp_runner.config.plan import Gpu
from ddp_runner.diagnostics.doctor.checks import FAIL, OK, SKIPPED, WARN, Check

SMI_TIMEOUT_S = 10.0
_SMI_L = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")
_SMI_MIG = re.compile(r"^\s+MIG (.+?)\s+Device\s+(\d+): \(UUID: ([^)]+)\)\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_smi_list(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi -L`` → ``[{"index", "name", "uuid", "mig": [...]}]`` (MIG instances under their GPU)."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _SMI_L.match(line.strip())
        if m:
            gpus.append({"index": int(m.group(1)), "name": m.group(2), "uuid": m.group(3), "mig": []})
            continue
        m = _SMI_MIG.match(line)
        if m and gpus:
            gpus[-1]["mig"].append({"profile": m.group(1), "device": int(m.group(2)), "uuid": m.group(3)})
    return gpus


def parse_topology(text: str) -> dict[str, Any]:
    """``nvidia-smi topo -m`` → the GPU-to-GPU link matrix.

    Returns ``{"gpus": ["GPU0", ...], "links": {"GPU0-GPU1": "NV18", ...}, "nvlink_all_pairs": bool}``; raises
    ValueError when the text holds no matrix (restricted output).
    """
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    header = next((ln.split() for ln in lines if re.match(r"^\s+GPU\d+", ln)), None)
    if not header:
        raise ValueError("no GPU matrix in nvidia-smi topo -m output")
    gpu_cols = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    col_of = {h: i for i, h in enumerate(header)}
    links: dict[str, str] = {}
    for ln in lines:
        cells = ln.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]) or cells[0] not in gpu_cols:
            continue
        row = cells[1:]
        for other in gpu_cols:
            i = col_of[other]
            if other != cells[0] and i < len(row) and gpu_cols.index(cells[0]) < gpu_cols.index(other):
                links[f"{cells[0]}-{other}"] = row[i]
    nvlink = bool(links) and all(v.startswith("NV") for v in links.values())
    return {"gpus": gpu_cols, "links": links, "nvlink_all_pairs": nvlink}


def visible_mapping(gpus: Sequence[Gpu], visible: str | None) -> tuple[str, str, list[dict[str, Any]]]:
    """Apply CUDA_VISIBLE_DEVICES (CUDA's rules, via :func:`ddp_runner.config.devices.select_visible`) and judge it.

    Returns ``(status, summary, mapping)`` where mapping lists ``{"local_rank", "physical_index", "name", "uuid"}``.
    An entry that names no GPU, or repeats one, is a failure: CUDA silently stops at it, so fewer GPUs are
    visible than the variable lists.
    """
    chosen = select_visible(list(gpus), visible)
    mapping = [{"local_rank": i, "physical_index": g.physical_index, "name": g.name, "uuid": g.uuid}
               for i, g in enumerate(chosen)]
    arrow = ", ".join(f"{m['local_rank']}→GPU{m['physical_index']}" for m in mapping)
    if not gpus:
        if visible is None:
            return SKIPPED, "no GPUs on this host (CUDA_VISIBLE_DEVICES unset)", mapping
        return WARN, f"CUDA_VISIBLE_DEVICES={visible!r} is set but this host shows no GPU (no driver)", mapping
    if visible is None:
        return OK, f"CUDA_VISIBLE_DEVICES unset: all {len(gpus)} visible, local rank {arrow}", mapping
    listed = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry or re.fullmatch(r"-\d+", entry):
            break  # an empty or negative entry ends the list on purpose ("-1" is the usual way to hide all GPUs)
        listed.append(entry)
    if not listed:
        return WARN, "CUDA_VISIBLE_DEVICES is empty: it hides every GPU (CPU-only run)", mapping
    if len(chosen) < len(listed):
        bad = listed[len(chosen)]
        if bad.startswith("MIG-"):
            return WARN, f"CUDA_VISIBLE_DEVICES names MIG instance {bad}: mapping not resolved here", mapping
        known = ", ".join(str(g.physical_index) for g in gpus)
        why = "repeats a device" if bad in listed[: len(chosen)] or _names_chosen(bad, chosen) else \
            f"names no GPU on this host (indices {known})"
        seen = f"only {len(chosen)} visible ({arrow})" if chosen else "no GPU visible"
        return FAIL, f"CUDA_VISIBLE_DEVICES={visible!r}: entry {bad!r} {why}; CUDA stops there, so {seen}", mapping
    return OK, f"CUDA_VISIBLE_DEVICES={visible!r}: local rank {arrow}", mapping


def _names_chosen(entry: str, chosen: Sequence[Gpu]) -> bool:
    return any((entry.isdigit() and g.physical_index == int(entry)) or g.uuid.startswith(entry)
               or g.uuid.startswith("GPU-" + entry) for g in chosen)


def _smi(args: list[str]) -> subprocess.CompletedProcess[str] | str:
    """Run nvidia-smi; an error string when it is absent or cannot run."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no NVIDIA driver found (nvidia-smi is not on PATH)"
    try:
        return subprocess.run([smi, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"nvidia-smi {' '.join(args)} took over {SMI_TIMEOUT_S:.0f} s"
    except OSError as e:
        return f"nvidia-smi could not run: {e}"


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def devices_check() -> Check:
    """``nvidia-smi -L``: the GPUs the driver shows (all of them: nvidia-smi ignores CUDA_VISIBLE_DEVICES)."""
    out = _smi(["-L"])
    if isinstance(out, str):
        return Check("devices", SKIPPED if "no NVIDIA driver" in out else FAIL, out, {"driver": False, "gpus": []})
    if out.returncode != 0:
        return Check("devices", FAIL, f"nvidia-smi -L failed (exit {out.returncode}): "
                     f"{_first_line(out.stderr or out.stdout)}", {"driver": True, "gpus": []})
    gpus = parse_smi_list(out.stdout)
    if not gpus:
        return Check("devices", FAIL, "nvidia-smi -L lists no GPU", {"driver": True, "gpus": []})
    names = sorted({g["name"] for g in gpus})
    return Check("devices", OK, f"{len(gpus)} × {' / '.join(names)}", {"driver": True, "gpus": gpus})


def topology_check() -> Check:
    """``nvidia-smi topo -m``; where it is restricted or fails the topology is "not visible", never "absent"
    (containers and VMs often hide it: hidden telemetry says nothing about the hardware)."""
    out = _smi(["topo", "-m"])
    if isinstance(out, str):
        return Check("topology", SKIPPED, f"not visible: {out}", {"visible": False})
    if out.returncode != 0:
        why = _first_line(out.stderr or out.stdout) or f"exit {out.returncode}"
        return Check("topology", WARN, f"not visible here ({why}); does not mean the GPUs lack NVLink: check the "
                     "offering's documentation", {"visible": False})
    try:
        topo = parse_topology(out.stdout)
    except ValueError:
        return Check("topology", WARN, "not visible here (nvidia-smi topo -m shows no matrix); does not mean the "
                     "GPUs lack NVLink", {"visible": False, "raw": out.stdout[-2000:]})
    topo["visible"] = True
    if not topo["links"]:
        return Check("topology", OK, f"{len(topo['gpus'])} GPU: no GPU-to-GPU link to show", topo)
    kinds = sorted(set(topo["links"].values()))
    how = "NVLink between every pair" if topo["nvlink_all_pairs"] else "not all pairs on NVLink"
    return Check("topology", OK, f"{how} ({', '.join(kinds)})", topo)


def visible_check(gpus: Sequence[Gpu] | None = None, environ: dict[str, str] | None = None) -> Check:
    """CUDA_VISIBLE_DEVICES and the local-rank → physical-GPU mapping (``config.devices``, which asks nvidia-smi)."""
    env = os.environ if environ is None else environ
    host = all_gpus() if gpus is None else list(gpus)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    status, summary, mapping = visible_mapping(host, visible)
    return Check("visible devices", status, summary, {"CUDA_VISIBLE_DEVICES": visible, "mapping": mapping})

