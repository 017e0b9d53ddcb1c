"""Checkpoints damaged as a crash or a bad disk leaves them, and what a test reads back: the resume-fallback tests
(tests/unit/test_resume_fallback.py in process, tests/e2e/test_resume_fallback_e2e.py through the CLI) share it."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ddp_runner.tasks.engine import checkpoint as ck


def truncate(ckpt: Path) -> None:
    """Cut the checkpoint's state file to half its size (a write that ended early): its size check fails."""
    state = ckpt / ck.STATE_FILE
    os.truncate(state, state.stat().st_size // 2)


def flip_byte(ckpt: Path) -> None:
    """Flip one byte in the middle of the checkpoint's state file (its size still right): its sha256 check fails."""
    state = ckpt / ck.STATE_FILE
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))


def step_state(step: int) -> dict:
    """A small state to save at ``step``, which names its step in what it holds."""
    return {"step": step, "w": torch.full((64,), float(step))}


def complete_names(root: Path) -> list[str]:
    """The names of the complete checkpoints under ``root``, oldest first."""
    return [Path(u).name for _, u in ck.list_complete(str(root))]
