"""Checkpoints: the policy (``manager``: what, when, from where, whether), atomic storage on any fsspec URL,
background saving, sharded saves, and every rank's RNG state."""

from ddp_runner.tasks.engine.checkpoint.async_saver import AsyncSaver
from ddp_runner.tasks.engine.checkpoint.rng import rng_state, set_rng_state
from ddp_runner.tasks.engine.checkpoint.storage import (
    META_FILE,
    STATE_FILE,
    CheckpointError,
    cleanup_partial,
    is_checkpoint,
    latest,
    list_complete,
    load,
    load_first_good,
    save,
    step_url,
)

__all__ = [
    "AsyncSaver", "CheckpointError", "META_FILE", "STATE_FILE", "cleanup_partial", "is_checkpoint", "latest",
    "list_complete", "load", "load_first_good", "rng_state", "save", "set_rng_state", "step_url",
]
