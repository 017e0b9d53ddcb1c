"""Worker side: ``task.module`` → the task's ``build``, and where in the task's own code an error came from.

Directories the driver found a task module in (outside the installed packages) come through
``layout.ENV_TASK_PATH`` and are appended to ``sys.path``: appended, so a stray ``tasks.py`` in a user's directory
can never shadow this package.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING

from ddp_runner.contract import layout

if TYPE_CHECKING:
    import torch

    from ddp_runner.tasks.api import TaskParts
    from ddp_runner.tasks.engine.config import Config

_task: dict[str, str] = {}  # the task module this process imports (one per worker): its name and file
# This package's folders (the engine's frames are never the task's) and the interpreter's library folders.
_PRODUCT = (os.path.dirname(os.path.realpath(__file__)) + os.sep,
            os.path.dirname(os.path.dirname(os.path.realpath(layout.__file__))) + os.sep)
_LIBRARIES = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "purelib", "platlib")})


def import_task(module: str) -> ModuleType:
    """Import the task module (its directory from the driver appended to ``sys.path`` first)."""
    for extra in filter(None, os.environ.get(layout.ENV_TASK_PATH, "").split(os.pathsep)):
        if extra not in sys.path:
            sys.path.append(extra)
    _task.clear()
    try:  # known before the import runs, so that an error in the module's own top level is placed too
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.origin:
            _task.update(name=module, origin=spec.origin)
    except (ImportError, ValueError):
        pass  # the import below says what is wrong
    return importlib.import_module(module)


def build(cfg: Config, device: torch.device) -> TaskParts:
    """Call the task's ``build(cfg, device)``; its training set must be the size the driver planned with."""
    parts = import_task(cfg.task.module).build(cfg, device)
    check_train_samples(cfg, parts)
    return parts


def check_train_samples(cfg: Config, parts: TaskParts) -> None:
    """With data=synthetic the driver planned the epochs (and refused what some rank could not fill) with
    ``data.num_samples``: a task that loaded another number of samples would run another plan than run.json's.
    Refused before any step, naming both numbers and the two ways to tell the driver the real one."""
    from ddp_runner.tasks.api import ConfigError

    planned = cfg.data.get("num_samples") if cfg.data.get("name") == "synthetic" else None
    try:
        real = len(parts.train_set)  # type: ignore[arg-type]
    except TypeError:  # an iterable dataset has no length: nothing to hold it to
        return
    if planned is None or real == planned:
        return
    raise ConfigError("data.num_samples", planned,
                      f"the driver planned with {planned} training samples, but {cfg.task.module}.build() made"
                      f" {real}", "tell the driver the training set's size: train_samples(cfg), returning"
                      f" len(train_set) ({real} here), in the task's task.checks module (docs/own-task.md), or"
                      f" data.num_samples={real}")


def task_home(name: str, origin: str) -> tuple[str, ...]:
    """Path prefixes of the code of task module ``name`` (found at ``origin``): the folder a user's module is
    imported from (its other files are the user's too), an installed package's own folder, or a built-in task's
    own file or sub-package."""
    origin = os.path.realpath(origin)
    package = origin.endswith("__init__.py")
    if origin.startswith(_PRODUCT[0]):  # a task shipped in this package (ddp_runner.tasks.smoke,
                                        # ddp_runner.tasks.gpt.task)
        return (os.path.dirname(origin) + os.sep,) if name.count(".") > 1 else (origin,)
    root = os.path.dirname(origin)
    for _ in range(name.count(".") + package):
        root = os.path.dirname(root)
    if not (root + os.sep).startswith(_LIBRARIES):
        return (root + os.sep,)
    return (os.path.join(root, name.split(".")[0]) + os.sep,) if "." in name or package else (origin,)


def where_in_task(exc: BaseException) -> str | None:
    """``file:line in function`` of the innermost frame of ``exc`` in the task's own code (not the engine's, not a
    library's); when the task's code is not on the stack because the call into it failed (a ``forward`` whose
    signature does not take ``(x, y)``), the definition of the module's ``forward`` the engine was calling. None
    when no task is loaded or neither is found."""
    home = task_home(_task["name"], _task["origin"]) if _task else ()
    if not home:
        return None
    inside_product, inside_library = home[0].startswith(_PRODUCT), home[0].startswith(_LIBRARIES)

    def own(path: str) -> bool:
        real = os.path.realpath(path)
        return (real.startswith(home) and (inside_product or not real.startswith(_PRODUCT))
                and (inside_library or not real.startswith(_LIBRARIES)))

    for f in reversed(traceback.extract_tb(exc.__traceback__)):
        if own(f.filename):
            return f"{f.filename}:{f.lineno} in {f.name}"
    return _called_forward(exc.__traceback__, own)


def _called_forward(tb: TracebackType | None, own: Callable[[str], bool]) -> str | None:
    """The task's ``forward`` that the innermost ``nn.Module`` call on the stack was about to run."""
    import inspect

    called = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in ("_call_impl", "_wrapped_call_impl"):
            called = tb.tb_frame.f_locals.get("self", called)
        tb = tb.tb_next
    forward = getattr(type(called), "forward", None) if called is not None else None
    try:
        path, line = inspect.getsourcefile(forward), inspect.getsourcelines(forward)[1]
    except (TypeError, OSError):
        return None
    if path is None or not own(path):
        return None
    return f"{path}:{line} in {type(called).__name__}.forward (the engine calls model(x, y))"
