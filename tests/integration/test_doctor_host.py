"""ddp-doctor: parsing and busbw arithmetic as pure functions, the visible-device mapping and topology through a
fake ``nvidia-smi`` first on PATH, the real command on this CPU host (gloo all-reduce in 2 real processes), and
``cheap_report`` staying cheap (no torch import)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_runner.diagnostics import doctor
from ddp_runner.diagnostics.doctor import FAIL, OK, SKIPPED, WARN, MiB
from tests.support.fake_smi import check_named

ROOT = Path(__file__).resolve().parents[2]
# --- the real command on this host --------------------------------------------------------------------------------

def _doctor(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run([sys.executable, "-m", "ddp_runner.diagnostics.doctor", *args], cwd=ROOT, env=env,
                          capture_output=True,
                          text=True, timeout=timeout)


no_driver = pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has an NVIDIA driver")


@no_driver
def test_json_on_this_host_measures_gloo_in_two_processes() -> None:
    proc = _doctor("--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] in (OK, WARN)
    devices, topo = check_named(report, "devices"), check_named(report, "topology")
    assert devices["status"] == SKIPPED and devices["summary"].startswith("no NVIDIA driver found")
    assert topo["summary"].startswith("not visible") and "absent" not in topo["summary"]
    assert check_named(report, "gloo")["status"] == OK
    assert check_named(report, "host")["data"]["cpus"] >= 1
    shm = check_named(report, "/dev/shm")
    assert shm["data"]["size_bytes"] > 0
    bw = check_named(report, "bandwidth")
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
    from ddp_runner.contract.layout import SAFE_ENV

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
from ddp_runner.diagnostics.doctor import cheap_report
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
    vis = check_named(report, "visible devices")
    if gpu:
        assert vis["status"] == OK and vis["data"]["mapping"][0]["physical_index"] == 1
        assert check_named(report, "topology")["data"]["nvlink_all_pairs"] is True
    else:
        assert vis["status"] == SKIPPED and vis["data"]["CUDA_VISIBLE_DEVICES"] == "1"
        assert "devices" not in names
