"""The light side of own_file_regression (no torch): ``train_samples(cfg)`` tells the driver how many records the
task's file holds, from its size alone, so that the plan is made with the set the ranks will load."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ddp_runner.tasks.api import ConfigError

RECORD_BYTES = 4 * (4 + 1)  # own_file_regression.RECORD_BYTES (that module imports torch)


def check(cfg: Mapping[str, Any]) -> None:
    """task.file must be a file of whole records."""
    path = cfg["task"].get("file")
    if not path or not os.path.isfile(str(path)):
        raise ConfigError("task.file", path, "no such file", "give the task's data file: +task.file=<path>")
    if os.path.getsize(str(path)) % RECORD_BYTES:
        raise ConfigError("task.file", path, f"is no whole number of {RECORD_BYTES}-byte records",
                          "write it with own_file_regression.write")


def train_samples(cfg: Mapping[str, Any]) -> int:
    """The training set's size: the file's records."""
    return os.path.getsize(str(cfg["task"]["file"])) // RECORD_BYTES
