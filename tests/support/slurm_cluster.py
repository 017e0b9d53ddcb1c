"""A real Slurm on localhost for the tests: munged, slurmctld and two slurmd's (nodes n1 and n2, both this host on
127.0.0.1, distinct ports), from Debian's ``slurm-wlm`` and ``munge``. Started as root (slurmd must be), in a
private directory with its own munge key, ports and state; torn down by the pids it wrote."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.support.ports import free_ports

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel")
NODES = ("n1", "n2")


def why_not() -> str | None:
    """Why a local Slurm cannot be started here, or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge"
                " (.ci/run does this as root)")
    if os.geteuid() != 0:
        return "starting slurmd needs root (slurmd runs jobs as their users); .ci/run runs the tests as root"
    return None


def _conf(d: Path, ports: list[int], cpus: int) -> str:
    nodes = "\n".join(f"NodeName={n} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 Port={p} CPUs={cpus}"
                      " State=UNKNOWN" for n, p in zip(NODES, ports[1:], strict=True))
    return f"""ClusterName=ddptest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=3600
KillWait=25
MessageTimeout=10
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def start(d: Path, cpus: int = 2, timeout: float = 60) -> dict[str, str]:
    """Start munged, slurmctld and the slurmd's under ``d``; return the environment that points at them."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "state").mkdir(exist_ok=True)
    for n in NODES:
        (d / f"spool-{n}").mkdir(exist_ok=True)
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = d / "slurm.conf"
    conf.write_text(_conf(d, free_ports(1 + len(NODES)), cpus))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={d}/munge.sock",
                    f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munge.seed"],
                   check=True, env=env, timeout=30)
    subprocess.run(["slurmctld", "-i"], check=True, env=env, timeout=30)
    for n in NODES:
        subprocess.run(["slurmd", "-N", n], check=True, env=env, timeout=30)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(["sinfo", "-h", "-o", "%T %D"], capture_output=True, text=True, env=env, timeout=30)
        if r.stdout.split()[:2] == ["idle", str(len(NODES))]:
            return {"SLURM_CONF": str(conf)}
        time.sleep(0.5)
    stop(d)
    raise RuntimeError(f"local Slurm did not come up: sinfo says {r.stdout!r}; logs in {d}")


def drain(env: dict[str, str], timeout: float = 60) -> None:
    """Cancel this cluster's jobs and wait until Slurm has none left: a job step still reporting its end when its
    slurmd stops would linger."""
    subprocess.run(["scancel", "--full", f"--user={os.geteuid()}"], env=env, timeout=60, check=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=env, timeout=30)
        if r.returncode == 0 and not r.stdout.strip():
            return
        time.sleep(0.5)


def stop(d: Path) -> None:
    """Stop what :func:`start` started, by the pids the daemons wrote (slurmd's first: they hold the jobs)."""
    pids = [_pid(d / f"slurmd-{n}.pid") for n in NODES] + [_pid(d / "slurmctld.pid"), _pid(d / "munged.pid")]
    for pid in pids:
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 20
    for pid in pids:
        while pid and time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a daemon's zombie waits for init to reap it
    except psutil.NoSuchProcess:
        return False


