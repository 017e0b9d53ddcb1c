"""Debug mode (``debug=true``) on the worker side: torch's and NCCL's debug output into private per-rank files.

The driver turns the libraries' debug output on in the workers' environment (runner/diagnostics/setup.py:
TORCH_DISTRIBUTED_DEBUG=DETAIL, TORCH_CPP_LOG_LEVEL=INFO, NCCL_DEBUG=INFO). Here, before torch is imported, this
rank sends its C-level stderr (where torch's C++ logs go) to ``logs/debug/rank<R>.log`` and NCCL's to
``logs/debug/rank<R>.nccl.log``: owner-only (they hold topology and addresses), whatever the umask, and never on
the console. Python's own ``sys.stderr`` (tracebacks, warnings) stays in the rank's ordinary log. torch is imported
here, after the redirection, to work around a crash of DDP under DETAIL (see :func:`_skip_ddp_construction_log`).
"""

from __future__ import annotations

import os
import sys

from ddp_runner.contract import layout


def _private_fd(path: str) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)  # also when the file existed (a continued run) or the umask was odd
    return fd


def apply(local_dir: str, rank: int) -> None:
    """Route this rank's debug output into its private files (call right after the rank log is set up)."""
    directory = os.path.join(local_dir, layout.DEBUG_LOGS)
    os.makedirs(directory, mode=0o700, exist_ok=True)  # the driver made it; a remote root's staging may not have
    os.chmod(directory, 0o700)
    nccl = os.path.join(local_dir, layout.rank_debug_log(rank, "nccl"))
    os.close(_private_fd(nccl))  # NCCL reopens it with fopen("w"), which keeps the mode
    os.environ["NCCL_DEBUG_FILE"] = nccl
    fd = _private_fd(os.path.join(local_dir, layout.rank_debug_log(rank)))
    sys.stderr.flush()
    python_stderr = os.dup(2)  # the rank log
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = os.fdopen(python_stderr, "w", buffering=1)
    _skip_ddp_construction_log()


def _skip_ddp_construction_log() -> None:
    """With TORCH_DISTRIBUTED_DEBUG=DETAIL the process group is wrapped for collective checks, and DDP's
    construction-time usage log (``Logger.set_construction_data_and_log``) then crashes the process with SIGSEGV
    (torch 2.13, CPU/gloo; a plain DDP script shows it). In debug mode that one log call is skipped: DDP itself and
    the DETAIL checks are unchanged."""
    import torch.distributed as dist

    logger = getattr(dist, "Logger", None)
    if logger is not None and hasattr(logger, "set_construction_data_and_log"):
        logger.set_construction_data_and_log = lambda *_args, **_kwargs: None
