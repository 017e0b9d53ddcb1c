"""The house rules, checked on the import graph: no import circles, imports point one way, and the only module
the driver (runner/, the package ``ddp_runner``) and the workers (tasks/, ``ddp_runner.tasks``) share is the contract
(runner/contract/, ``ddp_runner.contract``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The checkout's folders and the import packages they install as (pyproject.toml's package-dir).
PACKAGES = {"runner": "ddp_runner", "tasks": "ddp_runner.tasks"}
TOP = "ddp_runner"
WORKER = "ddp_runner.tasks"
CONTRACT = "ddp_runner.contract"
# Floors of the driver, lowest first: a room imports only from its own floor or below.
# The console shares the diagnostics' floor (the closing account reads the time breakdown, whose table textfit fits);
# supervision is under the launchers that run torchrun through it.
FLOORS = {"ddp_runner.contract": 0, "ddp_runner.config": 1, "ddp_runner.data": 2, "ddp_runner.rundir": 2,
          "ddp_runner.diagnostics": 3, "ddp_runner.trackers": 3, "ddp_runner.console": 3, "ddp_runner.supervise": 4,
          "ddp_runner.report": 4, "ddp_runner.launch": 5, "ddp_runner.job": 6, "ddp_runner.cli": 7,
          "ddp_runner.__main__": 8}
# Task-side modules that the driver runs before launch (a task's `task.checks` hook), not the workers.
DRIVER_HOOKS = ("ddp_runner.tasks.smoke_checks", "ddp_runner.tasks.gpt.checks")


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def is_worker(module: str) -> bool:
    return within(module, WORKER)


def is_driver(module: str) -> bool:
    return within(module, TOP) and not is_worker(module)


def module_names() -> dict[str, Path]:
    """Every module of the two folders, by its installed dotted name."""
    out = {}
    for folder, pkg in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [pkg, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules ``path`` imports, at module level or inside functions (a lazy import is an edge too)."""
    found: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and within(t, TOP):
                found.add(t)
    return found


def graph() -> dict[str, set[str]]:
    mods = module_names()
    known = set(mods)
    g = {name: imports_of(path, name, known) for name, path in mods.items()}
    # importing a.b.c runs a/__init__ and a/b/__init__: parent packages are edges only when they import something
    return {n: {t for t in targets if not (n.startswith(t + ".") and not g.get(t))} for n, targets in g.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def room(module: str) -> str | None:
    return next((r for r in sorted(FLOORS, key=len, reverse=True) if module == r or module.startswith(r + ".")),
                None)


def test_no_import_circles() -> None:
    assert cycles(graph()) == []


def test_the_contract_is_the_only_shared_module() -> None:
    """tasks/ imports nothing of runner/ but the contract; runner/ imports nothing of tasks/; the contract imports
    nothing of the project outside itself."""
    g = graph()
    crossing = sorted(f"{a} -> {b}" for a, targets in g.items() for b in targets
                      if (is_worker(a) and is_driver(b) and not within(b, CONTRACT))
                      or (is_driver(a) and is_worker(b))
                      or (within(a, CONTRACT) and not within(b, CONTRACT)))
    assert crossing == []


def test_imports_point_down_the_floors() -> None:
    g = graph()
    upward = []
    for a, targets in g.items():
        if not is_driver(a) or room(a) is None:
            continue
        for b in targets:
            rb = room(b)
            if rb is not None and FLOORS[rb] > FLOORS[room(a)]:
                upward.append(f"{a} -> {b}")
    assert sorted(upward) == []


def test_every_driver_module_has_a_room() -> None:
    homeless = [m for m in module_names() if is_driver(m) and m != TOP and room(m) is None]
    assert homeless == []


def test_no_reach_into_private_names() -> None:
    """``from x import _private`` and ``module._private`` across modules are not used between project modules."""
    mods = module_names()
    reaches = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        imported_modules: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and within(node.module or "", TOP):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    if full in mods:
                        imported_modules[a.asname or a.name] = full
                    elif a.name.startswith("_") and not a.name.startswith("__") and node.module != name:
                        reaches.append(f"{name}: from {node.module} import {a.name}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in imported_modules and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                reaches.append(f"{name}: {imported_modules[node.value.id]}.{node.attr}")
    assert sorted(set(reaches)) == []


_BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name.startswith(b + ".") for b in BLOCKED) and not any(
                name == a or name.startswith(a + ".") for a in ALLOWED):
            raise ImportError(f"blocked: {name}")
        return None
sys.meta_path.insert(0, Block())
"""


def _import_with_blocked(modules: list[str], blocked: list[str], allowed: list[str]) -> subprocess.CompletedProcess:
    code = (f"BLOCKED = {blocked!r}\nALLOWED = {allowed!r}\n" + _BLOCKER
            + "".join(f"import {m}\n" for m in modules))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_workers_import_with_the_driver_blocked() -> None:
    """What torchrun starts on a rank (tasks/__main__, the engine, the built-in tasks) imports with every module of
    runner/ but the contract blocked (the package ``ddp_runner`` itself, runner/__init__.py, is empty)."""
    workers = sorted(m for m in module_names() if is_worker(m) and m not in DRIVER_HOOKS)
    proc = _import_with_blocked(workers, [TOP], [CONTRACT, WORKER])
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_driver_imports_with_the_engine_blocked() -> None:
    driver = sorted(m for m in module_names() if is_driver(m) and m != "ddp_runner.__main__")
    proc = _import_with_blocked(driver, [WORKER], [])
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_graph_checker_sees_a_circle() -> None:
    """The checks above can fail: a two-module circle and a deep one are found."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert room("ddp_runner.config.plan") == "ddp_runner.config" and room("ddp_runner.cli") == "ddp_runner.cli"
    assert is_worker("ddp_runner.tasks.engine") and not is_driver("ddp_runner.tasks")
    assert is_driver("ddp_runner.contract") and is_driver("ddp_runner") and not is_driver("ddp_runner_x")


def test_the_cli_stays_a_thin_shell_and_no_driver_function_needs_a_scroll_bar() -> None:
    """cli.py at most 250 lines with no function over 60; no function of runner/ over 80 lines."""
    assert len((ROOT / "runner" / "cli.py").read_text().splitlines()) <= 250
    long = []
    for name, path in module_names().items():
        if not is_driver(name):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > (60 if name == "ddp_runner.cli" else 80):
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert long == []


def test_every_package_ships_in_the_wheel() -> None:
    """pyproject.toml lists packages by name: a new subpackage left out would be missing from an installed wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join([pkg, *p.parent.relative_to(ROOT / folder).parts]) for folder, pkg in PACKAGES.items()
             for p in (ROOT / folder).rglob("__init__.py")}
    assert found - listed == set()
    assert TOP in listed and WORKER in listed and "ddp_runner.conf" in listed
