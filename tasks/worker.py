"""One rank's life, however torchrun started it: a fresh interpreter (``python -m ddp_runner.tasks <run dir>``,
tasks/__main__.py) or a fork of the agent's preloaded forkserver (tasks/forked.py).

Reads the resolved config from the run directory (workers never run Hydra), then hands over to the one
training engine. Only the driver creates directories.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import os
import signal
import socket
import sys
import time
from typing import IO

from ddp_runner.contract import layout, netbind, osutil
from ddp_runner.tasks.engine import startup, worker_io
from ddp_runner.tasks.engine.reporting import progress
from ddp_runner.tasks.engine.stop import signals


def main(run_dir: str | None = None, started: float | None = None) -> int:
    """Run this rank into ``run_dir`` (default: ``DDP_RUNNER_RUN_DIR``); return its exit code. ``started``: when
    its imports began, if not now (Unix seconds)."""
    startup.mark("worker_start", started)
    run_dir = run_dir or os.environ.get(layout.ENV_RUN_DIR)
    if not run_dir:  # `python -m ddp_runner.tasks` with no run directory: one line, not a KeyError
        print(f"ddp_runner.tasks: refused: no run directory: pass it (python -m ddp_runner.tasks RUN_DIR) or set"
              f" {layout.ENV_RUN_DIR}; ddp-run does both", file=sys.stderr, flush=True)
        return layout.EXIT_REFUSED
    local_dir = os.environ.get(layout.ENV_LOCAL_DIR, run_dir)
    rank = int(os.environ.get("RANK", "0"))
    osutil.die_with_parent(signal.SIGKILL)  # torchrun's agent gone: no rank may outlive it
    console = worker_io.redirect_output(local_dir, rank)
    progress.stage(console, "importing torch")  # the driver's bar says what the start-up is doing
    if os.environ.get(layout.ENV_DEBUG):  # before torch is imported: its C++ logs go to the private debug log
        from ddp_runner.tasks.engine.diagnostics import debug

        debug.apply(local_dir, rank)
    if os.environ.get("LOCAL_WORLD_SIZE", "1") != os.environ.get("WORLD_SIZE", "1"):  # several nodes
        node = os.environ.get(layout.ENV_NODE) or os.environ.get("GROUP_RANK")
        print(f"ddp-run: rank {rank} on node {node} (host {socket.gethostname()}, local rank"
              f" {os.environ.get('LOCAL_RANK')}, group rank {os.environ.get('GROUP_RANK')})", flush=True)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        netbind.install()  # rank 0 hosts the job's store itself: on its host's address only
    signals.install()  # on SIGTERM, the checkpoint being written is finished first
    # A crash in native code (SIGSEGV, SIGABRT, …) leaves every thread's Python stack in the rank log.
    faulthandler.enable(file=sys.stderr, all_threads=True)
    # An error record left by an earlier attempt (elastic restart, resume) must not pass for this one's.
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(local_dir, layout.rank_error(rank)))
    try:
        from ddp_runner.tasks.engine import trainer  # noqa: F401 - the engine's imports, timed as the start-up's

        startup.mark("imports")
        train_rank(run_dir, local_dir, console)
        return 0
    except BaseException as exc:  # noqa: B036 - every failure, KeyboardInterrupt too, is recorded
        worker_io.record_error(local_dir, rank, exc)
        _torchrun_error_file(exc)
        import traceback

        traceback.print_exc()
        return 1


def train_rank(run_dir: str, local_dir: str, console: IO[str] | None) -> None:
    """Train this rank to the end, then report ``rank R device D completed``: its set-up (process group, device),
    the loggers opened beside it, the trainer, the heartbeat, the rank's facts at start and end, and a teardown
    that never waits on a peer after a failure."""
    from concurrent.futures import ThreadPoolExecutor

    import torch
    import torch.distributed as dist

    from ddp_runner.contract import stops
    from ddp_runner.tasks.engine import rank
    from ddp_runner.tasks.engine.config import load_config
    from ddp_runner.tasks.engine.diagnostics import faults, heartbeat
    from ddp_runner.tasks.engine.trackers.open import open_trackers
    from ddp_runner.tasks.engine.trainer import Trainer

    cfg = load_config(run_dir)
    faults.configure(cfg.get("fault"))
    preempt, grace_s = stops.of(cfg.get("checkpoint"))
    signals.configure(grace_s, preempt)
    writer_future = None
    if int(os.environ.get("RANK", "0")) == 0:
        # The loggers' imports (and the trackers' first requests) overlap the process-group and DDP set-up instead
        # of delaying the first step.
        writer_future = ThreadPoolExecutor(1).submit(open_trackers, cfg, run_dir, local_dir, console)
    t0 = time.perf_counter()
    progress.stage(console, "joining the process group")
    ctx = rank.setup(run_dir, local_dir, console, cfg)
    startup.mark("process_group")
    progress.stage(console, "building the model and data")
    print(f"startup: process group ready in {time.perf_counter() - t0:.1f} s", flush=True)
    worker_io.write_json(local_dir, layout.rank_facts(ctx.rank), rank.facts(ctx, completed=False))
    failed = False
    try:
        trainer = Trainer(cfg, ctx, writer_future)
        trainer.maybe_resume()
        heartbeat.start(local_dir, ctx.rank, trainer.state.step, enabled=bool((cfg.get("watchdog") or {}).get(
            "timeout_s")), nccl=cfg.backend == "nccl")
        startup.mark("ready")
        progress.stage(console, "first step")
        print(f"startup: task, model, DDP and data ready in {time.perf_counter() - t0:.1f} s", flush=True)
        summary = trainer.train()
        trainer.close()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        heartbeat.phase("done")
        heartbeat.stop()
        stopped = trainer.stopped
        line = f"rank {ctx.rank} device {rank.device_label(ctx)} " + (
            f"stopped at step {stopped['step']}" if stopped else "completed")
        print(line, flush=True)
        worker_io.write_json(local_dir, layout.rank_facts(ctx.rank),
                             rank.facts(ctx, completed=stopped is None, exit_code=0, stopped=stopped,
                                        summary=summary if ctx.is_main else None))
        if stopped:
            signals.done()
    except BaseException as exc:  # noqa: B036 - the time of any failure, before the teardown below
        failed = True
        worker_io.mark_failure_time(exc)
        heartbeat.flush()  # the step this rank reached: its peers may be killed before they record theirs
        # Recorded before the teardown too (tasks/__main__.py writes the same record again): should the teardown
        # ever wait on a peer, the driver still learns what failed here.
        worker_io.record_error(local_dir, ctx.rank, exc)
        raise
    finally:
        if dist.is_initialized():
            if failed and dist.get_backend() == dist.Backend.NCCL:
                # A peer may be waiting in a collective this rank will never join, and NCCL's orderly teardown can
                # wait for it: this rank would hang before recording its error, and torchrun would never learn
                # of the failure. Aborting the communicators does not wait. (A private API: if it is gone, the
                # process exits without tearing the group down, which does not wait either.)
                with contextlib.suppress(Exception):
                    dist.distributed_c10d._abort_process_group()
            else:
                dist.destroy_process_group()


def _torchrun_error_file(exc: BaseException) -> None:
    """Also leave torchrun's own error file (``TORCHELASTIC_ERROR_FILE``, as its ``@record`` would), so that
    torchrun's failure report shows this rank's traceback instead of "To enable traceback see …"."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE") or not isinstance(exc, Exception):
        return
    with contextlib.suppress(Exception):  # its report only; the runner's own record is written above
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)


def fast_exit(code: int) -> None:
    """Exit without the interpreter's module-by-module teardown of torch (~0.7 s per rank).

    Only after a clean finish: the engine has waited for its checkpoint, closed TensorBoard, stopped the
    DataLoader workers and destroyed the process group. Exit handlers still run and streams are flushed.
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def after_failure() -> None:
    """What a rank does after ``main`` returned non-zero, before it exits."""
    # A rank whose collective failed because a peer went away may get here before torchrun's SIGTERM: it
    # finishes (and logs) the checkpoint in flight just as the SIGTERM path would.
    signals.finish_now("stopping after the error")
    # After a failure the trainer is garbage in a reference cycle. Collect it now, while the interpreter is whole:
    # at finalization, the destructor of DDP's Python comm hook would need the GIL and abort the process
    # (SIGABRT instead of exit code 1).
    gc.unfreeze()  # the engine froze the heap after the first step (tasks/engine.py)
    gc.collect()
