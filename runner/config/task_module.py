"""Driver side: find the module a task names (``task.module``) and run its own checks, before launch.

The module is located without being imported (importing a task imports torch, which the driver must not pay
for at start-up): its spec is found, its source is parsed, and ``build`` must be defined at its top level. Its
own top-level imports must be findable too, so a missing dependency is refused here rather than on every rank.
A directory the user runs from is searched *after* the installed packages, and handed to the workers the same
way (``layout.ENV_TASK_PATH``), so a stray ``tasks.py`` there can never shadow this package.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from typing import Any

from ddp_runner.contract.errors import PlanError

_FIX = ("set task.module to an importable module that defines build(cfg, device) -> TaskParts"
        " (installed, on PYTHONPATH, or in the directory you run ddp-run from)")


# The preset a task given only by ``task.module=`` composes (conf/task/custom.yaml): none of another task's keys.
CUSTOM_PRESET = "custom"
# The resolver conf/task/custom.yaml names the run with: ``${ddp_task_name:${task.module}}``.
NAME_RESOLVER = "ddp_task_name"


def task_name(module: Any) -> str:
    """A task's name from its module: ``mytask`` → ``mytask``, ``mypkg.image.task`` → ``image`` (a module called
    ``task`` is named after its package), ``path/to/mytask.py`` → ``mytask``, reduced to the characters a run
    directory's name may hold."""
    module = str(module or "")
    if module.endswith(".py"):  # a file: path/to/mytask.py
        module = os.path.basename(module)[: -len(".py")]
    parts = [p for p in module.split(".") if p]
    if len(parts) > 1 and parts[-1] == "task":
        parts = parts[:-1]
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in (parts[-1] if parts else ""))
    return name or "task"


def register_resolver() -> None:
    """Let Hydra's composed config name a ``task.module``-only task after its module (idempotent)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(NAME_RESOLVER):
        OmegaConf.register_new_resolver(NAME_RESOLVER, task_name)


def module_only(overrides: list[str]) -> bool:
    """Whether the command line names a task's module but no task preset (``task.module=x`` without ``task=``):
    such a task composes :data:`CUSTOM_PRESET`, not the default preset's keys and checks."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o or o.startswith("~")}
    return "task.module" in keys and "task" not in keys


def from_file(value: Any, cwd: str | None = None) -> tuple[Any, str | None]:
    """``task.module`` given as a file (``path/to/mytask.py``): its module name and its folder, searched first;
    anything else as it is, with no folder."""
    if not isinstance(value, str) or not value.endswith(".py"):
        return value, None
    path = os.path.join(cwd or os.getcwd(), os.path.expanduser(value))
    name = os.path.basename(path)[: -len(".py")]
    if not os.path.isfile(path):
        raise PlanError("task.module", value, "no such file", "give the path of your task's .py file (relative to"
                        " the folder you run ddp-run from), or its module name: task.module=mytask")
    if not name.isidentifier():
        raise PlanError("task.module", value, f"{name!r} is not a Python module name",
                        "rename the file to a valid module name (letters, digits, _), e.g. my_task.py")
    return name, os.path.dirname(os.path.abspath(path))


def findable(module: str, cwd: str | None = None) -> bool:
    """Whether ``module`` can be found as installed or in ``cwd`` (default: the working directory)."""
    if not all(p.isidentifier() for p in module.split(".")):
        return False
    try:
        return (_find_spec(module, []) or _find_spec(module, [cwd or os.getcwd()])) is not None
    except (ImportError, ValueError):
        return False


def _find_spec(module: str, extra: list[str]) -> Any:
    added = [p for p in extra if p not in sys.path]
    sys.path.extend(added)
    try:
        return importlib.util.find_spec(module)
    finally:
        for p in added:
            sys.path.remove(p)


def locate(module: Any, cwd: str | None = None, extra: list[str] | None = None) -> str | None:
    """Check that ``module`` can be imported by the workers and defines ``build``.

    Looked for as installed, then in ``cwd`` (default: the working directory), then in ``extra``. Returns the
    directory the workers must append to ``sys.path`` to import it (None when it is importable as installed), or
    raises :class:`PlanError` naming the module, the problem and the fix.
    """
    if not isinstance(module, str) or not module or not all(p.isidentifier() for p in module.split(".")):
        raise PlanError("task.module", module, "not a dotted Python module name", _FIX)
    cwd = cwd or os.getcwd()
    try:
        spec = _find_spec(module, [])
        where = None
        for place in [cwd, *(extra or [])]:
            if spec is None:
                spec = _find_spec(module, [place])
                where = place if spec is not None else None
    except (ImportError, ValueError) as exc:  # a parent package that fails to import
        raise PlanError("task.module", module, f"cannot be imported ({type(exc).__name__}: {exc})", _FIX) from exc
    if spec is None:
        raise PlanError("task.module", module, "no such module (ModuleNotFoundError)", _FIX)
    origin = spec.origin
    if where is None and origin and _root_of(origin, module) == os.path.realpath(cwd):
        where = cwd  # found through `python -m`'s working directory on sys.path, which the workers (-P) lack
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        _check_unparsed(module, spec, where)  # frozen, built-in, C extension or namespace: no source to parse
        return where
    try:
        with open(origin, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=origin)
    except (SyntaxError, UnicodeDecodeError, OSError) as exc:
        raise PlanError("task.module", module, f"cannot be imported ({type(exc).__name__}: {exc})",
                        f"fix {origin}") from exc
    if "build" not in _top_level_names(tree):
        raise PlanError("task.module", module, f"defines no build() ({origin})",
                        "define build(cfg, device) -> ddp_runner.tasks.api.TaskParts at the module's top level")
    missing = [m for m in _top_level_imports(tree, module) if _find_spec(m, [where] if where else []) is None]
    if missing:
        raise PlanError("task.module", module,
                        f"cannot be imported: it imports {missing[0]!r}, which is not installed"
                        f" (ModuleNotFoundError, from {origin})",
                        f"install {missing[0]} into this environment, or remove the import")
    return where


def _check_unparsed(module: str, spec: Any, where: str | None) -> None:
    """A module with no Python source to parse must still define ``build``: a namespace package (a folder with no
    ``__init__.py``) cannot; a frozen, built-in or compiled module is imported here to look (the standard library's
    cost nothing, and a user's compiled task is rare)."""
    if spec.origin in (None, "namespace") or (spec.submodule_search_locations is not None and not spec.has_location
                                              and spec.loader is None):
        raise PlanError("task.module", module, "is a namespace package (a folder without __init__.py), which"
                        " defines no build()", "point task.module at the module inside it that defines build(cfg,"
                        " device), e.g. task.module=" + module + ".task")
    if where and where not in sys.path:
        sys.path.append(where)
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - whatever its import raises, the workers would meet it too
        raise PlanError("task.module", module, f"cannot be imported ({type(exc).__name__}: {exc})", _FIX) from exc
    if not callable(getattr(mod, "build", None)):
        kind = {"frozen": "a frozen module", "built-in": "a built-in module"}.get(str(spec.origin),
                                                                                 f"a compiled module ({spec.origin})")
        raise PlanError("task.module", module, f"defines no build(): it is {kind}, not a task",
                        "point task.module at your task's module, which defines build(cfg, device) -> TaskParts")


def _root_of(origin: str, module: str) -> str:
    """The directory ``module`` is imported from, given the file it was found in."""
    up = module.count(".") + (os.path.basename(origin) == "__init__.py")
    path = os.path.dirname(os.path.realpath(origin))
    for _ in range(up):
        path = os.path.dirname(path)
    return path


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.AnnAssign,)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _top_level_imports(tree: ast.Module, module: str) -> list[str]:
    """Absolute top-level package names imported unconditionally at the module's top level."""
    found: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            found += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module.split(".")[0])
    own = module.split(".")[0]
    return [m for m in dict.fromkeys(found) if m != own and m != "__future__"]


def run_checks(cfg: Mapping[str, Any], where: str | None) -> None:
    """Call the task's own ``check(cfg)`` (module ``task.checks``) if it names one."""
    checks = cfg["task"].get("checks")
    if not checks:
        return
    if where and where not in sys.path:
        sys.path.append(where)
    try:
        mod = importlib.import_module(checks)
    except ImportError as exc:
        raise PlanError("task.checks", checks, f"cannot be imported ({type(exc).__name__}: {exc})",
                        "set task.checks to a light module with check(cfg), or null") from exc
    if not callable(getattr(mod, "check", None)):
        raise PlanError("task.checks", checks, "defines no check(cfg)", "define check(cfg) there, or set null")
    mod.check(cfg)


def own_train_samples(cfg: Mapping[str, Any], where: str | None) -> int | None:
    """The training set's size from the task's ``task.checks`` module, for a task that makes or loads its own
    dataset (``train_samples(cfg) -> int``, light: no torch); None where it defines none. The driver plans with
    it, so the plan and the ranks never disagree on the set's size. PlanError when it answers no count."""
    checks = cfg["task"].get("checks")
    if (fn := _checks_hook(checks, where, "train_samples")) is None:
        return None
    try:
        n = fn(cfg)
    except PlanError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: refused naming it, never a driver traceback
        raise PlanError("task.checks", checks, f"train_samples(cfg) raised {type(exc).__name__}: {exc}",
                        f"fix {checks}.train_samples, which tells the driver the training set's size") from exc
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise PlanError("task.checks", checks, f"train_samples(cfg) returned {n!r}, not a count of samples",
                        "return the training set's length, a whole number of at least 1 (len(train_set))")
    return n


def memory_facts(cfg: Mapping[str, Any], where: str | None) -> dict[str, Any] | None:
    """The model's parameter counts from the task's ``task.checks`` module, when it computes them without torch
    (``memory_facts(cfg)``: the keys of tasks/engine/driver_probe.py's ``model`` answer); None otherwise."""
    fn = _checks_hook(cfg["task"].get("checks"), where, "memory_facts")
    return fn(cfg) if fn is not None else None


def _checks_hook(checks: str | None, where: str | None, name: str) -> Any:
    """The function ``name`` of the task's light checks module, or None where there is no module, it does not
    import (run_checks reports that, with the fix) or it defines no such function."""
    if not checks:
        return None
    if where and where not in sys.path:
        sys.path.append(where)
    try:
        fn = getattr(importlib.import_module(checks), name, None)
    except ImportError:
        return None
    return fn if callable(fn) else None
