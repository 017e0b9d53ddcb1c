"""ddp-doctor: parsing and busbw arithmetic as pure functions, the visible-device mapping and topology through a
fake ``nvidia-smi`` first on PATH, the real command on this CPU host (gloo all-reduce in 2 real processes), and
``cheap_report`` staying cheap (no torch import)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from runner.diagnostics import doctor
from runner.diagnostics.doctor import FAIL, OK, SKIPPED, WARN, MiB

ROOT = Path(__file__).resolve().parents[2]
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
        f"  'topo -m') if [ -n \"$FAKE_SMI_TOPO_RESTRICTED\" ]; then {restricted}; fi",
        f"    printf '%b' '{_escaped(TOPO_NVLINK)}' ;;",
        '  *) echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2 ;;',
        "esac", ""]))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("FAKE_SMI_TOPO_RESTRICTED", raising=False)
    return smi


def _check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


# --- the real command on this host --------------------------------------------------------------------------------

def _doctor(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run([sys.executable, "-m", "runner.diagnostics.doctor", *args], cwd=ROOT, env=env,
                          capture_output=True,
                          text=True, timeout=timeout)


no_driver = pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has an NVIDIA driver")


@no_driver
def test_json_on_this_host_measures_gloo_in_two_processes() -> None:
    proc = _doctor("--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] in (OK, WARN)
    devices, topo = _check(report, "devices"), _check(report, "topology")
    assert devices["status"] == SKIPPED and devices["summary"].startswith("no NVIDIA driver found")
    assert topo["summary"].startswith("not visible") and "absent" not in topo["summary"]
    assert _check(report, "gloo")["status"] == OK
    assert _check(report, "host")["data"]["cpus"] >= 1
    shm = _check(report, "/dev/shm")
    assert shm["data"]["size_bytes"] > 0
    bw = _check(report, "bandwidth")
    assert bw["status"] == OK, bw
    assert bw["data"]["backend"] == "gloo" and bw["data"]["nranks"] == 2
    assert [r["bytes"] for r in bw["data"]["rows"]] == [1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]
    assert all(r["busbw_gbps"] > 0 and r["iters"] >= 3 for r in bw["data"]["rows"])
    assert all(r["reference_busbw_gbps"] is None for r in bw["data"]["rows"])


@no_driver
def test_table_on_this_host(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # In this process (torch is imported once for the suite); the --json test above runs `python -m`.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert doctor.main(["--sizes", "1M,2M"]) == 0
    out = capsys.readouterr().out
    for line in ("devices          skipped  no NVIDIA driver found", "topology         skipped  not visible",
                 "gloo             ok", "bandwidth        ok       gloo on 2 CPU processes: busbw"):
        assert line in out, out
    assert "no reference figure" in out and out.rstrip().endswith("overall: ok")


def test_workers_run_with_nvlink_multicast_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.contract.layout import SAFE_ENV

    for k in SAFE_ENV:
        monkeypatch.delenv(k, raising=False)
    result = doctor.measure_bandwidth("cpu", 2, [4096], 1, 3, timeout_s=120)
    assert {k: result["env"].get(k) for k in SAFE_ENV} == SAFE_ENV  # what the workers ran under
    assert not set(SAFE_ENV) & set(os.environ)  # added for the workers only


def test_a_failing_or_hanging_rank_is_a_failed_check() -> None:
    # A size no machine can allocate: every rank fails in its first allocation, a real error in a real worker.
    check = doctor.bandwidth_check("cpu", 2, [1 << 50], None, None, timeout_s=120)
    assert check.status == FAIL and "failed:" in check.summary and "RuntimeError" in check.summary, check
    # A deadline shorter than the workers' start: what a hang looks like from outside.
    check = doctor.bandwidth_check("cpu", 2, [4096], None, None, timeout_s=0.2)
    assert check.status == FAIL and "did not finish in 0 s" in check.summary, check


# --- cheap_report ---------------------------------------------------------------------------------------------------

CHEAP = """
import json, sys
from runner.diagnostics.doctor import cheap_report
report = cheap_report(gpu={gpu})
print(json.dumps({{"torch": "torch" in sys.modules, "report": report}}))
"""


@pytest.mark.parametrize("gpu", [False, True])
def test_cheap_report_never_imports_torch(gpu: bool, fake_smi: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "1"}
    proc = subprocess.run([sys.executable, "-c", CHEAP.format(gpu=gpu)], env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["torch"] is False
    report = out["report"]
    json.dumps(report)  # run.json can hold it as is
    names = [c["name"] for c in report["checks"]]
    assert {"host", "/dev/shm", "environment", "visible devices"} <= set(names)
    assert "bandwidth" not in names and "torch" not in names
    vis = _check(report, "visible devices")
    if gpu:
        assert vis["status"] == OK and vis["data"]["mapping"][0]["physical_index"] == 1
        assert _check(report, "topology")["data"]["nvlink_all_pairs"] is True
    else:
        assert vis["status"] == SKIPPED and vis["data"]["CUDA_VISIBLE_DEVICES"] == "1"
        assert "devices" not in names
