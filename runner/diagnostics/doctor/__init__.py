"""ddp-doctor: the seed's prerequisite checks for multi-GPU training, as one command.

Devices (``nvidia-smi -L``), topology (``nvidia-smi topo -m``), the visible-device mapping (local rank → physical
GPU), torch's view (device count, NCCL, gloo), ``/dev/shm``, the NCCL_*/TORCH_*/CUDA_* variables in effect, and a
short all-reduce bus-bandwidth measurement in real processes with a real process group (NCCL on GPUs, gloo on CPU).

Every check has a status (ok / warn / fail / skipped) and a one-line explanation; the exit code is 1 when any
check fails. :func:`cheap_report` is the part cheap enough for every run (no torch import, no bandwidth): the
driver stores it in run.json.

torch is imported only inside the torch checks and the bandwidth measurement, so the driver can import this
package for :func:`cheap_report` at no cost.

The package's modules: ``checks`` (statuses, the host, /dev/shm, the environment, torch), ``gpus`` (nvidia-smi and
the visible-device mapping), ``bandwidth`` (the all-reduce measurement), ``report`` (the reports and their table),
``cli`` (``ddp-doctor``). The names below are its public face.
"""

from ddp_runner.diagnostics.doctor.bandwidth import (
    CPU_SIZES,
    GPU_SIZES,
    REFERENCES,
    Reference,
    allreduce_bandwidth,
    bandwidth_check,
    bench_env,
    measure_bandwidth,
    reference_for,
)
from ddp_runner.diagnostics.doctor.checks import (
    CPU_INDEX,
    FAIL,
    OK,
    SKIPPED,
    WARN,
    Check,
    GiB,
    MiB,
    env_check,
    host_check,
    human_bytes,
    overall,
    parse_size,
    shm_check,
    torch_build,
    torch_checks,
)
from ddp_runner.diagnostics.doctor.cli import main
from ddp_runner.diagnostics.doctor.gpus import (
    devices_check,
    parse_smi_list,
    parse_topology,
    topology_check,
    visible_check,
    visible_mapping,
)
from ddp_runner.diagnostics.doctor.report import cheap_report, full_report, render

__all__ = ["CPU_INDEX", "CPU_SIZES", "FAIL", "GPU_SIZES", "OK", "REFERENCES", "SKIPPED", "WARN", "Check", "GiB", "MiB",
           "Reference", "allreduce_bandwidth", "bandwidth_check", "bench_env", "cheap_report", "devices_check",
           "env_check", "full_report", "host_check", "human_bytes", "main", "measure_bandwidth", "overall",
           "parse_size", "parse_smi_list", "parse_topology", "reference_for", "render", "shm_check", "topology_check",
           "torch_build", "torch_checks", "visible_check", "visible_mapping"]
