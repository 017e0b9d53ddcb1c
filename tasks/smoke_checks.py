"""Task ``smoke``'s own keys, checked by the driver before launch through ``task.checks`` (no torch import)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_runner.contract.rules import check_keys, integer
from ddp_runner.tasks.api import ConfigError

# tasks/smoke.py reads these (and data.num_samples / data.seed, which the driver checks as the data group's).
RULES = (integer("task.in_features", lo=1, example="8"), integer("task.out_features", lo=1, example="1"))


def check(cfg: Mapping[str, Any]) -> None:
    """The linear layer's shape, and synthetic data (the only data the smoke task makes)."""
    for rule in RULES:
        if rule.key.split(".", 1)[1] not in cfg["task"]:
            raise ConfigError(rule.key, None, "is missing, and the smoke task needs it", f"e.g. {rule.key}=8")
    check_keys(cfg, RULES)
    name = (cfg.get("data") or {}).get("name")
    if name != "synthetic":
        raise ConfigError("data", name, "task=smoke makes its own random samples", "use data=synthetic")
