"""Vocabulary shared by the driver and the workers: run-tree paths and manifest/summary fields.

The run directory is the only interface between the two sides, so its names live here and nowhere else.
This module must stay import-light (standard library only): both sides import it at start-up.
"""

from __future__ import annotations

import os
import posixpath

CONFIG = "config.yaml"
MANIFEST = "run.json"
SUMMARY = "summary.json"
# The live driver's lease on its run directory (runner/rundir/lease.py): one writer per run directory.
DRIVER_LEASE = "driver.json"
LOGS = "logs"
TB = "tb"
CHECKPOINTS = "checkpoints"
PROFILE = "profile"  # torch.profiler traces and their summaries (train.profile.steps > 0)
# Under a local output root: the compile caches (inductor, triton) that every run and sweep job under it shares.
COMPILE_CACHE = ".compile_cache"
# Inside checkpoints/: step_<N>/ holds CKPT_STATE, and CKPT_MARKER written last commits it (complete only then).
CKPT_STATE = "state.pt"
CKPT_MARKER = "meta.json"
# torchrun's own agent log, beside the ranks' logs (a multi-node run: one per node, see node_agent_log).
AGENT_LOG = f"{LOGS}/torchrun.log"
# Multi-node runs: each node's driver records its host, devices and outcome in nodes/<node>.json.
NODES = "nodes"
# Slurm runs: the batch script the runner wrote and what Slurm said about the job.
SLURM_SCRIPT = "slurm/job.sbatch"
SLURM_JOB = "slurm/job.json"
SLURM_LOG = "slurm/job-%j.out"
# Beside token files written by ddp-tokenize: vocabulary, token counts, source and hash.
TOKENS_META = "meta.json"

# Exit code of a refused plan: bad input, nothing started.
EXIT_REFUSED = 2

STATUS_RUNNING = "running"
STATUS_COMPLETED = "completed"
STATUS_FAILED = "failed"
# Stopped by Ctrl-C / SIGTERM to the driver (exit 128 + signal).
STATUS_INTERRUPTED = "interrupted"
# Stopped by the pre-emption signal (checkpoint.stop_signal: Slurm's warning before a time limit or preemption);
# a requeued Slurm job continues it (runner/contract/stops.py).
STATUS_PREEMPTED = "preempted"
# A stop asked for by a driver that cannot signal its workers without killing them (Slurm: a signal to srun cancels
# the step): {"signal": N}. Rank 0 looks for it about once a second and the ranks agree on it like on a signal.
STOP_REQUEST = f"{LOGS}/stop-request.json"
# Stopped early by a search's pruner (runner/job/search.py): a stop like an interrupt (a checkpoint, continuable with
# resume=<run dir>), asked by the sweep's driver, which writes the prune record at ENV_PRUNE_REQUEST's path first.
STATUS_PRUNED = "pruned"
# Submitted to a scheduler (launcher=slurm), not started yet.
STATUS_QUEUED = "queued"
# Never written: what a reader makes of a `running` run whose driver is gone (runner/rundir/status.py).
STATUS_LOST = "lost"

# Environment variable through which the driver tells workers where the run directory is.
ENV_RUN_DIR = "DDP_RUNNER_RUN_DIR"
# Local directory for files libraries insist on writing locally (logs, TensorBoard) when the run
# directory is remote; equal to the run directory when it is local.
ENV_LOCAL_DIR = "DDP_RUNNER_LOCAL_DIR"
# When the driver started (Unix seconds), so a rank can report its time to first step from the launch.
ENV_T0 = "DDP_RUNNER_T0"
ENV_LAUNCH_T = "DDP_RUNNER_LAUNCH_T"  # when the driver started torchrun (Unix seconds)
# Directories (os.pathsep-separated) that workers append to sys.path to import a task module found there by the
# driver: appended, not prepended, so a stray file in the user's directory cannot shadow an installed module.
ENV_TASK_PATH = "DDP_RUNNER_TASK_PATH"
# Where TCPStore servers listen (contract/netbind.py): unset = the address of the store's host name; "any" = every
# interface (torch's own behaviour).
ENV_STORE_BIND = "DDP_RUNNER_STORE_BIND"
# Multi-node runs: the node's name (its launcher.node_rank, or host-pid), which its workers log and record.
ENV_NODE = "DDP_RUNNER_NODE"
# Test-only checkpoint hooks, read once by tasks/engine/diagnostics/faults.py (rehearsal faults are config: fault.*).
ENV_SLOW_SAVE = "DDP_RUNNER_SLOW_SAVE"
ENV_CKPT_TEST_PAUSE = "DDP_RUNNER_CKPT_TEST_PAUSE"
# Set by the driver when debug=true: the worker sends its C-level stderr (torch's C++ logs) to its private debug log.
ENV_DEBUG = "DDP_RUNNER_DEBUG"
# Diagnostics (the driver's watchdog, tasks/engine/diagnostics/): each rank's progress (step, phase), rewritten at most
# about once a second; every rank's stacks when the watchdog finds one stuck; its record of the hang; private
# debug logs (debug=true).
PROGRESS = f"{LOGS}/progress"
STACKS = f"{LOGS}/stacks"
HANG_RECORD = f"{LOGS}/hang.json"
DEBUG_LOGS = f"{LOGS}/debug"
# Created by the driver when it finds a hang: ranks on NCCL then dump the flight recorder (best effort).
DUMP_REQUEST = f"{STACKS}/.dump-requested"
# Per-rank memory (GiB) the memory planner may count on when strategy.memory_cap_gb is null (the memory planner).
ENV_MEMORY_CAP_GB = "DDP_RUNNER_MEMORY_CAP_GB"
# run.json: the memory planner's per-rank estimate under each strategy.
MANIFEST_MEMORY_PLAN = "memory_plan"
# Test-only: seconds between the driver's heartbeats in run.json (default runner/rundir/status.py HEARTBEAT_S).
ENV_HEARTBEAT_S = "DDP_RUNNER_HEARTBEAT_S"

# Set while torchrun's agent imports tasks/preload.py before it forks the ranks' server ("agent"), or in the
# environment of a server started as a fresh interpreter ("1"), and nowhere else (runner/launch/forkserver.py):
# tasks/preload.py says what the start-up does there, and prepares a spawned server for forking ranks (not a test
# that imports it).
ENV_FORKSERVER = "DDP_RUNNER_FORKSERVER"
FORKSERVER_AGENT, FORKSERVER_SPAWNED = "agent", "1"

# A live terminal (runner/console/live.py): the driver draws rank 0's progress; rank 0 then writes its console as
# JSON lines into this file (tasks/engine/reporting/progress.py) instead of onto the user's terminal. The env var
# holds the file's path; unset, rank 0 writes plain lines to its stdout.
CONSOLE_RECORDS = f"{LOGS}/console.jsonl"
ENV_CONSOLE_RECORDS = "DDP_RUNNER_CONSOLE_RECORDS"
# A job of a concurrent sweep (runner/job/pool.py), a ddp-run of its own: what its parent tells it (JSON: job
# number, swept values, sweep directory, where to write its outcome), and where its rank 0 writes console
# records for the sweep's view.
ENV_SWEEP_JOB = "DDP_RUNNER_SWEEP_JOB"
ENV_SWEEP_CONSOLE = "DDP_RUNNER_SWEEP_CONSOLE"
# A concurrent sweep's folder of its jobs' consoles (job-<N>.log), in the sweep directory beside the jobs' runs.
SWEEP_JOB_LOGS = "jobs"
# A search's trial (runner/job/search.py): where the sweep's driver writes its prune record ({"step", "value",
# "pruner"}) before it stops the job; the job's driver then records the stop as ``pruned`` (supervise/finalize.py).
ENV_PRUNE_REQUEST = "DDP_RUNNER_PRUNE_REQUEST"

# Every environment built for workers keeps NVLink multicast off (it can take shared GPUs out of service).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def join(base: str, *parts: str) -> str:
    """Join URL or path components with '/' (fsspec URLs are always '/'-separated)."""
    return posixpath.join(base, *parts)


def rank_log(rank: int) -> str:
    """Relative path of a rank's log file."""
    return f"{LOGS}/rank{rank}.log"


def rank_facts(rank: int) -> str:
    """Relative path of the JSON facts a rank reports about itself (device, versions, completion)."""
    return f"{LOGS}/rank{rank}.json"


def rank_error(rank: int) -> str:
    """Relative path of the error record a failing rank leaves (time, type, traceback tail)."""
    return f"{LOGS}/rank{rank}.error.json"


def node_record(node: str | int) -> str:
    """Relative path of one node's record in a multi-node run (``node``: its node rank, or host-pid)."""
    return f"{NODES}/{node}.json"


def node_agent_log(node: str | int) -> str:
    """Relative path of one node's torchrun agent log in a multi-node run."""
    return f"{LOGS}/torchrun.node{node}.log"


def job_run_name(job_id: str, task: str, world_size: int) -> str:
    """Directory name of a multi-node run, ``<rdzv_id>_<task>_w<world_size>``, directly under the output root:
    every node computes the same path from the same command line, whenever it starts."""
    return f"{job_id}_{task}_w{world_size}"


def rank_progress(rank: int) -> str:
    """Relative path of a rank's progress record (pid, optimizer step, phase, when the phase began)."""
    return f"{PROGRESS}/rank{rank}.json"


def rank_stack(rank: int, kind: str = "py") -> str:
    """Relative path of a rank's stack dump: ``py`` (faulthandler, every thread), ``native`` (py-spy) or
    ``nccl`` (NCCL's flight recorder, pickled)."""
    suffix = {"py": "txt", "native": "native.txt", "nccl": "nccl_trace.pkl"}[kind]
    return f"{STACKS}/rank{rank}.{suffix}"


def rank_debug_log(rank: int, what: str = "torch") -> str:
    """Relative path of a rank's private debug log (debug=true): ``torch`` (C++ and torch.distributed) or ``nccl``."""
    return f"{DEBUG_LOGS}/rank{rank}.log" if what == "torch" else f"{DEBUG_LOGS}/rank{rank}.{what}.log"


def run_name(time_hms: str, task: str, world_size: int, n: int = 0) -> str:
    """Directory name of one run: ``<HH-MM-SS>_<task>_w<world_size>[_<n>]``."""
    base = f"{time_hms}_{task}_w{world_size}"
    return base if n == 0 else f"{base}_{n}"


def compile_cache_dir(root: str) -> str:
    """Where runs under output root ``root`` keep their compile caches (absolute): ``<root>/.compile_cache``, or
    ``~/.cache/ddp-runner/compile`` on this host for a remote root (the caches are plain local files)."""
    if root.startswith("file://"):
        root = root[len("file://"):]
    if "://" in root:
        return os.path.expanduser(os.path.join("~", ".cache", "ddp-runner", "compile"))
    return os.path.join(os.path.abspath(root), COMPILE_CACHE)
