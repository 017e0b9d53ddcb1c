"""ddp-doctor: parsing and busbw arithmetic as pure functions, the visible-device mapping and topology through a
fake ``nvidia-smi`` first on PATH, the real command on this CPU host (gloo all-reduce in 2 real processes), and
``cheap_report`` staying cheap (no torch import)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ddp_runner.config.devices import visible_gpus
from ddp_runner.config.plan import Gpu
from ddp_runner.contract.layout import SAFE_ENV
from ddp_runner.diagnostics import doctor
from ddp_runner.diagnostics.doctor import FAIL, OK, SKIPPED, WARN, MiB
from tests.support.fake_smi import SMI_L, TOPO_NVLINK, UUID0, UUID1, check_named

TOPO_PCIE_NIC = ("\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
                 "GPU0\t X \tPIX\tSYS\tNODE\t0-15\t0\t\tN/A\n"
                 "GPU1\tPIX\t X \tSYS\tNODE\t0-15\t0\t\tN/A\n"
                 "GPU2\tSYS\tSYS\t X \tSYS\t16-31\t1\t\tN/A\n"
                 "NIC0\tNODE\tNODE\tSYS\t X \n\nNIC Legend:\n\n  NIC0: mlx5_0\n")


# --- pure functions ---------------------------------------------------------------------------------------------

def test_busbw_follows_nccl_tests() -> None:
    # 512 MiB in 1 ms: algbw = 536.87 GB/s; busbw = algbw × 2(n−1)/n
    algbw, busbw = doctor.allreduce_bandwidth(512 * MiB, 1e-3, 2)
    assert algbw == pytest.approx(536.870912)
    assert busbw == pytest.approx(algbw)  # n=2: factor 1
    assert doctor.allreduce_bandwidth(1e9, 1.0, 8) == pytest.approx((1.0, 1.75))
    assert doctor.allreduce_bandwidth(1e9, 1.0, 4)[1] == pytest.approx(1.5)
    assert doctor.allreduce_bandwidth(1e9, 1.0, 1)[1] == 0.0  # one rank: nothing crosses a link
    with pytest.raises(ValueError):
        doctor.allreduce_bandwidth(1e9, 0.0, 2)


def test_sizes_parse_in_binary_units() -> None:
    assert [doctor.parse_size(s) for s in ("1M", "4MB", "512MiB", "1G", "64k", "4096")] == [
        MiB, 4 * MiB, 512 * MiB, 1 << 30, 64 << 10, 4096]
    assert doctor.human_bytes(512 * MiB) == "512 MiB" and doctor.human_bytes(6) == "6 B"
    for bad in ("", "12T", "-1M", "2"):
        with pytest.raises(ValueError):
            doctor.parse_size(bad)


def test_smi_list_and_topology_parse() -> None:
    mig = SMI_L + "  MIG 1g.18gb     Device  0: (UUID: MIG-aaaa-bbbb)\n"
    gpus = doctor.parse_smi_list(mig)
    assert [(g["index"], g["name"], g["uuid"]) for g in gpus] == [(0, "NVIDIA H200", UUID0), (1, "NVIDIA H200", UUID1)]
    assert gpus[1]["mig"] == [{"profile": "1g.18gb", "device": 0, "uuid": "MIG-aaaa-bbbb"}]

    nv = doctor.parse_topology(TOPO_NVLINK)
    assert nv == {"gpus": ["GPU0", "GPU1"], "links": {"GPU0-GPU1": "NV18"}, "nvlink_all_pairs": True}
    pcie = doctor.parse_topology(TOPO_PCIE_NIC)  # NIC rows and columns are not GPU links
    assert pcie["links"] == {"GPU0-GPU1": "PIX", "GPU0-GPU2": "SYS", "GPU1-GPU2": "SYS"}
    assert pcie["nvlink_all_pairs"] is False
    with pytest.raises(ValueError):
        doctor.parse_topology("Topology is not supported in this environment\n")


def test_reference_figure_only_for_matching_hardware() -> None:
    nv = doctor.parse_topology(TOPO_NVLINK)
    assert doctor.reference_for("NVIDIA H200", 2, 512 * MiB, nv).busbw_gbps == 315.0
    assert doctor.reference_for("NVIDIA H200", 2, 512 * MiB, None) is not None  # topology not visible
    assert doctor.reference_for("NVIDIA H200", 2, 512 * MiB, doctor.parse_topology(TOPO_PCIE_NIC)) is None
    assert doctor.reference_for("NVIDIA H200", 4, 512 * MiB, nv) is None
    assert doctor.reference_for("NVIDIA H200", 2, 64 * MiB, nv) is None
    assert doctor.reference_for("NVIDIA A100-SXM4-80GB", 2, 512 * MiB, nv) is None


def test_visible_mapping_follows_cuda_rules() -> None:
    host = [Gpu(0, "NVIDIA H200", UUID0), Gpu(1, "NVIDIA H200", UUID1)]
    status, text, mapping = doctor.visible_mapping(host, "1,0")
    assert status == OK and [m["physical_index"] for m in mapping] == [1, 0], text
    status, _, mapping = doctor.visible_mapping(host, UUID1[:12])  # a UUID prefix, as CUDA accepts
    assert status == OK and [m["physical_index"] for m in mapping] == [1]
    status, text, mapping = doctor.visible_mapping(host, "0,5")
    assert status == FAIL and "'5'" in text and "names no GPU" in text and len(mapping) == 1, text
    status, text, _ = doctor.visible_mapping(host, "1,1")
    assert status == FAIL and "repeats" in text, text
    assert doctor.visible_mapping(host, "")[0] == WARN
    assert doctor.visible_mapping(host, "-1")[0] == WARN  # hides every GPU, on purpose
    assert [m["physical_index"] for m in doctor.visible_mapping(host, "1,-1,0")[2]] == [1]
    assert doctor.visible_mapping(host, None)[0] == OK
    assert doctor.visible_mapping([], None)[0] == SKIPPED
    assert doctor.visible_mapping([], "0")[0] == WARN  # a scheduler's value on a host with no driver


def test_environment_and_shm_judgements(tmp_path: Path) -> None:
    assert doctor.env_check({}).status == OK
    assert doctor.env_check({"NCCL_P2P_DISABLE": "1"}).status == WARN
    assert doctor.env_check({"NCCL_NVLS_ENABLE": "1"}).status == WARN
    ok = doctor.env_check({"NCCL_NVLS_ENABLE": "0", "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "HOME": "/x"})
    assert ok.status == OK and set(ok.data["variables"]) == {"NCCL_NVLS_ENABLE", "TORCH_DISTRIBUTED_DEBUG"}
    assert doctor.shm_check(str(tmp_path), minimum=1 << 62).status == WARN  # smaller than asked: warn
    assert doctor.shm_check(str(tmp_path / "absent")).status == WARN
    assert doctor.overall([doctor.Check("a", OK, ""), doctor.Check("b", SKIPPED, "")]) == OK
    assert doctor.overall([doctor.Check("a", WARN, ""), doctor.Check("b", FAIL, "")]) == FAIL


# --- a fake nvidia-smi ------------------------------------------------------------------------------------------

def test_mapping_and_topology_through_fake_nvidia_smi(fake_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert [g.physical_index for g in visible_gpus()] == [1, 0]  # what the driver records as the mapping
    report = doctor.cheap_report(gpu=True)
    devices, topo, vis = (check_named(report, n) for n in ("devices", "topology", "visible devices"))
    assert devices["status"] == OK and devices["summary"] == "2 × NVIDIA H200"
    assert topo["status"] == OK and topo["data"]["links"] == {"GPU0-GPU1": "NV18"}
    assert vis["status"] == OK and [(m["local_rank"], m["physical_index"], m["uuid"]) for m in vis["data"]["mapping"]
                                    ] == [(0, 1, UUID1), (1, 0, UUID0)]
    text = doctor.render(report)
    assert "0 → GPU1" in text and "GPU0-GPU1: NV18" in text

    monkeypatch.setenv("FAKE_SMI_TOPO_RESTRICTED", "1")
    topo = doctor.topology_check()
    assert topo.status == WARN and topo.summary.startswith("not visible") and "absent" not in topo.summary


def test_doctor_fails_on_a_device_that_does_not_exist(fake_smi: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,7")
    assert doctor.main(["--json", "--no-bandwidth"]) == 1
    report = json.loads(capsys.readouterr().out)
    vis = check_named(report, "visible devices")
    assert report["status"] == FAIL and vis["status"] == FAIL and "'7'" in vis["summary"]
    assert [m["physical_index"] for m in vis["data"]["mapping"]] == [0]
    # CPU torch sees no CUDA device although nvidia-smi shows one: said, not hidden
    assert check_named(report, "torch")["status"] == WARN
    assert check_named(report, "bandwidth")["status"] == SKIPPED


def test_usage_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as e:
        doctor.main(["--sizes", "12T"])
    assert e.value.code == 2
    assert doctor.main(["--nproc", "1"]) == 2


# --- no GPU, no NCCL --------------------------------------------------------------------------------------------

NCCL_SET = {"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": "1", "TORCH_DISTRIBUTED_DEBUG": "INFO"}


def test_no_nccl_variables_or_advice_without_a_gpu() -> None:
    cpu = doctor.env_check(NCCL_SET, gpu=False)
    assert cpu.status == OK and cpu.summary == "1 set (TORCH_DISTRIBUTED_DEBUG)", cpu
    assert cpu.data == {"variables": {"TORCH_DISTRIBUTED_DEBUG": "INFO"}, "added_for_workers": {}}
    assert doctor.env_check({}, gpu=False).summary == "none set"
    gpu = doctor.env_check(NCCL_SET, gpu=True)  # the same variables where GPUs are: each one judged
    assert gpu.status == WARN and "NCCL_P2P_DISABLE=1 switches an NCCL transport off" in gpu.summary
    assert "NCCL_DEBUG is on" in gpu.summary and "NCCL_NVLS_ENABLE=1 turns NVLink multicast on" in gpu.summary
    assert doctor.env_check({}, gpu=True).data["added_for_workers"] == SAFE_ENV


@pytest.mark.skipif(__import__("shutil").which("nvidia-smi") is not None, reason="this host has an NVIDIA driver")
def test_doctor_on_a_host_without_gpus_says_nothing_of_nccl(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in NCCL_SET.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert doctor.main(["--no-bandwidth"]) == 0
    text = capsys.readouterr().out
    assert "NCCL_" not in text and "NVSHMEM" not in text and "NVLink multicast" not in text, text
    assert re.search(r"^nccl +skipped +(not used: no CUDA device|not in this torch build).*CPU runs use gloo\)$",
                     text, re.M), text
    assert check_named(doctor.cheap_report(gpu=False), "environment")["data"]["added_for_workers"] == {}


def test_doctor_on_a_gpu_host_keeps_its_nccl_advice(fake_smi: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    assert doctor.main(["--no-bandwidth"]) == 0  # CPU torch on a fake GPU host: a warning, not a failure
    text = capsys.readouterr().out
    assert "NCCL_P2P_DISABLE=1 switches an NCCL transport off" in text
    assert "(added by ddp-run for workers)" in text


# --- which torch build ------------------------------------------------------------------------------------------

def test_the_torch_build_from_its_package_metadata() -> None:
    nvidia = ["filelock", 'nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"']
    assert doctor.torch_build("2.13.0+cpu", []) == "CPU"
    assert doctor.torch_build("2.13.0+cu128", nvidia) == "CUDA 12.8"
    assert doctor.torch_build("2.13.0+cu118", []) == "CUDA 11.8"
    assert doctor.torch_build("2.13.0+rocm6.2", []) == "ROCm 6.2"
    assert doctor.torch_build("2.13.0", nvidia) == "CUDA"  # PyPI's own Linux wheel
    assert doctor.torch_build("2.13.0", ["filelock"]) == "CPU"  # PyPI's macOS/Windows wheel
    host = doctor.host_check()  # this suite's torch, read without importing it
    assert re.search(r", torch \S+ \((CPU|CUDA[\d. ]*|ROCm \S+) build\), \d+ CPUs$", host.summary), host.summary
    assert host.data["torch_build"] in host.summary


def test_a_cuda_build_on_a_host_without_a_gpu_says_how_to_get_the_cpu_build(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    [own] = [c for c in doctor.torch_checks(None) if c.name == "torch"]
    assert f"the {own.data['build']} build" in own.summary
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    [check] = [c for c in doctor.torch_checks(None) if c.name == "torch"]
    assert check.status == WARN and check.summary.startswith(f"torch {torch.__version__}, the CUDA 12.8 build, 0 CUDA")
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in check.summary
    [on_gpu_host] = [c for c in doctor.torch_checks(0) if c.name == "torch"]  # a driver, GPUs hidden: no advice
    assert "index-url" not in on_gpu_host.summary
