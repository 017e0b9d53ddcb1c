"""The example task's own keys, checked by ddp-run before any process starts (named by ``task.checks``).

A light module: no torch import, so the driver's start-up stays quick. It uses the runner's :class:`Rule`
table, so each refusal names the key, the value and the fix like the runner's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_runner.contract.rules import check_keys, integer, number
from ddp_runner.tasks.api import ConfigError

# Every task.* key tiny_cnn.build reads.
RULES = (
    integer("task.classes", lo=1, example="4"),
    integer("task.image_size", lo=2, example="16"),  # one 2×2 max-pool must fit
    integer("task.width", lo=1, example="16"),
    number("task.dropout", lo=0, hi=1, hi_open=True, example="0.1"),
    integer("task.train_samples", lo=1, example="512"),
    integer("task.val_samples", lo=1, example="128"),
)


def check(cfg: Mapping[str, Any]) -> None:
    """The model's shape, dropout and dataset sizes; the training set must give every rank a micro-batch."""
    for rule in RULES:
        if rule.key.split(".", 1)[1] not in cfg["task"]:
            raise ConfigError(rule.key, None, "is missing, and the task needs it", "see conf/task/tiny_cnn.yaml")
    check_keys(cfg, RULES)
    n, ws, per_rank = cfg["task"]["train_samples"], cfg.get("world_size"), cfg["batch"]["per_rank"]
    if isinstance(ws, int) and n < ws * per_rank:
        raise ConfigError("task.train_samples", n,
                          f"fewer than world_size × batch.per_rank = {ws} × {per_rank} = {ws * per_rank}",
                          "set data.num_samples (which task.train_samples follows) higher, or lower batch.per_rank")
