"""What the checkpoint storage tests share: a staged (sharded) save as DCP's ranks would leave it, and a save
killed for real at the pause between its payload and its commit (``faults.Faults(commit_pause_s=…)``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest
import torch

from ddp_runner.contract import layout
from ddp_runner.tasks.engine import checkpoint as ck
from ddp_runner.tasks.engine.checkpoint import storage

ROOT = Path(__file__).resolve().parents[2]


def staged_save(root: str, step: int, payload: bytes = b"x" * 100) -> str:
    """A sharded save through storage.py: one rank's shard written into the stage, then the commit."""
    tmp = storage.stage_dir(root, step)
    assert step not in [s for s, _ in ck.list_complete(root)], "a staged directory is not a checkpoint"
    with fsspec.open(f"{tmp}/shards/__0_0.distcp", "wb", auto_mkdir=True) as f:
        f.write(payload)  # what DCP's ranks would write
    return ck.save(root, step, {"sharded": "shards", "v": torch.tensor([step])}, keep_last=2, staged=tmp)


def subprocess_env() -> dict[str, str]:
    """This environment, with the checkout first on PYTHONPATH (the scripts import ``tests`` and the product)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def kill_at_commit_pause(script: str, args: list[str], step: int, timeout_s: float = 120) -> None:
    """Run ``script`` (``python -c``) with ``args`` and SIGKILL it once its save of ``step`` pauses before the
    commit: a real crash, no cleanup handlers, no finally blocks. Fails when it never gets there."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], env=subprocess_env(), cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen: list[str] = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if layout.ENV_CKPT_TEST_PAUSE in line and f"step {step}" in line:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                return
        pytest.fail("the saving subprocess never reached the pause:\n" + "".join(seen))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
