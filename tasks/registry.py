"""Worker side: ``task.module`` → the task's ``build``.

Directories the driver found a task module in (outside the installed packages) come through
``layout.ENV_TASK_PATH`` and are appended to ``sys.path``: appended, so a stray ``tasks.py`` in a user's directory
can never shadow this package.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from runner.contract import layout

if TYPE_CHECKING:
    import torch

    from tasks.api import TaskParts
    from tasks.engine.config import Config


def import_task(module: str) -> ModuleType:
    """Import the task module (its directory from the driver appended to ``sys.path`` first)."""
    for extra in filter(None, os.environ.get(layout.ENV_TASK_PATH, "").split(os.pathsep)):
        if extra not in sys.path:
            sys.path.append(extra)
    return importlib.import_module(module)


def build(cfg: Config, device: torch.device) -> TaskParts:
    """Call the task's ``build(cfg, device)``."""
    return import_task(cfg.task.module).build(cfg, device)
