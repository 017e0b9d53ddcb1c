"""The contract between a task and the one training engine.

A task is an importable module named by ``task.module`` in its YAML (``ddp-run --config-dir conf task=<name>``) or
on the shell alone (``ddp-run task.module=<module>``: the run is named after the module and carries no other
task's keys). It exposes ``build(cfg, device) -> TaskParts``: a model, datasets and a FLOP count; it never owns a
loop. A task may also name, with ``task.checks``, a light module (no torch import) whose ``check(cfg)`` the driver
calls before launch; it raises :class:`ConfigError` naming the key, the value and the fix. The same module may
define ``train_samples(cfg) -> int``: the size of the training set ``build`` will return, for a task that loads
its own data (the driver plans the epochs with it and records it in run.json's ``plan.train_samples``; without it,
``data.num_samples``, which every rank then holds its built set to before the first step), and
``memory_facts(cfg)`` (the model's parameter counts, for the memory plan).

The model's ``forward(x, y)`` returns the micro-batch's mean loss, or ``(loss, {name: value})`` to report extra
metrics beside it (``{"accuracy": (logits.argmax(1) == y).float().mean()}``): each value the micro-batch's mean, a
scalar tensor or a number, the same names from every call, never ``loss``. The engine averages them over the
micro-steps and the ranks of each log interval (in the loss's own gather: no extra collective) and over the whole
validation set (each sample once), and logs ``train/<name>`` and ``val/<name>`` to TensorBoard, ``summary.json``
(``metrics``) and ``ddp-compare``'s table.

The trained weights are ``checkpoints/step_<N>/state.pt``'s ``"model"`` entry, a plain state dict:
``model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True)["model"])`` (docs/own-task.md).

This module imports nothing heavy, so the driver and light check modules may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ddp_runner.contract.errors import PlanError as ConfigError
from ddp_runner.tasks.engine.config import Config

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

__all__ = ["Config", "ConfigError", "TaskParts"]


@dataclass
class TaskParts:
    """What a task hands to the engine.

    ``model.forward(x, y)`` returns the *mean* loss over the micro-batch (a scalar tensor), so the engine can
    compute exact sums as ``mean * len(batch)``, or ``(loss, {name: mean value})`` with extra metrics. Dataset
    items are ``(x, y)`` tensor pairs (tensors or anything the default collate function stacks).
    """

    model: torch.nn.Module
    train_set: Dataset
    val_set: Dataset | None = None
    # Training FLOPs per sample (forward + backward), for MFU; None when unknown (MFU is then omitted).
    flops_per_sample: float | None = None
    # Tokens per sample, for tokens/s; None for tasks without tokens.
    tokens_per_sample: int | None = None
