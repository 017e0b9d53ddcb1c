"""Vocabulary shared by the driver and the workers: run-tree paths and manifest/summary fields.

The run directory is the only interface between the two sides, so its names live here and nowhere else.
This module must stay import-light (standard library only): both sides import it at start-up.
"""

from __future__ import annotations

import posixpath

CONFIG = "config.yaml"
MANIFEST = "run.json"
SUMMARY = "summary.json"
LOGS = "logs"
TB = "tb"
CHECKPOINTS = "checkpoints"
PROFILE = "profile"  # torch.profiler traces and their summaries (train.profile.steps > 0)
# Inside checkpoints/: step_<N>/ holds CKPT_STATE, and CKPT_MARKER written last commits it (complete only then).
CKPT_STATE = "state.pt"
CKPT_MARKER = "meta.json"
# torchrun's own agent log, beside the ranks' logs.
AGENT_LOG = f"{LOGS}/torchrun.log"
# Beside token files written by ddp-tokenize: vocabulary, token counts, source and hash.
TOKENS_META = "meta.json"

# Exit code of a refused plan: bad input, nothing started.
EXIT_REFUSED = 2

STATUS_RUNNING = "running"
STATUS_COMPLETED = "completed"
STATUS_FAILED = "failed"
# Stopped by Ctrl-C / SIGTERM to the driver (exit 128 + signal).
STATUS_INTERRUPTED = "interrupted"
# Never written: what a reader makes of a `running` run whose driver is gone (runner/status.py).
STATUS_LOST = "lost"

# Environment variable through which the driver tells workers where the run directory is.
ENV_RUN_DIR = "DDP_RUNNER_RUN_DIR"
# Local directory for files libraries insist on writing locally (logs, TensorBoard) when the run
# directory is remote; equal to the run directory when it is local.
ENV_LOCAL_DIR = "DDP_RUNNER_LOCAL_DIR"
# When the driver started (Unix seconds), so a rank can report its time to first step from the launch.
ENV_T0 = "DDP_RUNNER_T0"
# Directories (os.pathsep-separated) that workers append to sys.path to import a task module found there by the
# driver: appended, not prepended, so a stray file in the user's directory cannot shadow an installed module.
ENV_TASK_PATH = "DDP_RUNNER_TASK_PATH"
# Test-only fault injection, read once by tasks/engine/diagnostics/faults.py.
ENV_FAULT = "DDP_RUNNER_FAULT"
ENV_SLOW_SAVE = "DDP_RUNNER_SLOW_SAVE"
ENV_CKPT_TEST_PAUSE = "DDP_RUNNER_CKPT_TEST_PAUSE"
# Per-rank memory (GiB) the memory planner may count on when strategy.memory_cap_gb is null (runner/memory_plan.py).
ENV_MEMORY_CAP_GB = "DDP_RUNNER_MEMORY_CAP_GB"
# run.json: the memory planner's per-rank estimate under each strategy.
MANIFEST_MEMORY_PLAN = "memory_plan"
# Test-only: seconds between the driver's heartbeats in run.json (default runner/status.py HEARTBEAT_S).
ENV_HEARTBEAT_S = "DDP_RUNNER_HEARTBEAT_S"


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


def run_name(time_hms: str, task: str, world_size: int, n: int = 0) -> str:
    """Directory name of one run: ``<HH-MM-SS>_<task>_w<world_size>[_<n>]``."""
    base = f"{time_hms}_{task}_w{world_size}"
    return base if n == 0 else f"{base}_{n}"
