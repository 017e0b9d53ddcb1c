"""docs/layout.md is a newcomer's map of the code: it says what the folders install as, names every module of
runner/ and tasks/ (and none that is gone), and its three traces (a run, a stop, a checkpoint) name, step by step,
functions that exist in the files it says."""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "layout.md"
FOLDERS = ("runner", "tasks")
# A repo-relative module path as the page writes it: runner/supervise/stop/guard.py (not part of a longer path).
MODULE = re.compile(r"(?<![\w/.-])((?:runner|tasks)/(?:\w+/)*\w+\.py)(?![\w/])")
# A trace's step: `path:function`, `path:Class` or `path:Class.method`.
STEP = re.compile(r"`((?:runner|tasks)/(?:\w+/)*\w+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)`")
TRACES = ("A run", "A stop", "A checkpoint")


def page() -> str:
    return PAGE.read_text()


def modules_on_disk() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")
            if p.name != "__init__.py" and "__pycache__" not in p.parts}


@cache
def defined(path: str) -> frozenset[str]:
    """The top-level functions and classes of ``path``, and ``Class.method`` for each class's methods."""
    names: set[str] = set()
    for node in ast.parse((ROOT / path).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{m.name}" for m in node.body
                      if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return frozenset(names)


def section(text: str, title: str) -> str:
    """The text under the ``### title`` heading, up to the next heading."""
    match = re.search(rf"^### {re.escape(title)}\n(.*?)(?=^#)", text + "\n#", re.S | re.M)
    assert match is not None, f"docs/layout.md has no section '### {title}'"
    return match.group(1)


def numbered_steps(text: str) -> list[str]:
    """The items of the numbered lists in ``text``, each with its continuation lines."""
    return [m.group(1) for m in re.finditer(r"^\d+\. (.*?)(?=^\d+\. |\Z)", text, re.S | re.M)]


def test_the_page_names_every_module_of_runner_and_tasks() -> None:
    missing = sorted(modules_on_disk() - set(MODULE.findall(page())))
    assert not missing, ("modules docs/layout.md does not name (add a row each, 'path | its one job', to its room's"
                         f" table): {missing}")


def test_every_module_the_page_names_exists() -> None:
    gone = sorted(set(MODULE.findall(page())) - modules_on_disk())
    assert not gone, f"docs/layout.md names modules that do not exist: {gone}"


def test_every_traced_step_names_a_function_defined_in_its_file() -> None:
    steps = STEP.findall(page())
    assert len(steps) >= 60, "the traces name too few steps"
    wrong = sorted({f"{path}:{name}" for path, name in steps
                    if not (ROOT / path).is_file() or name not in defined(path)})
    assert not wrong, f"docs/layout.md names functions its files do not define: {wrong}"


def test_a_run_a_stop_and_a_checkpoint_are_traced_step_by_step() -> None:
    text = page()
    for title in TRACES:
        steps = numbered_steps(section(text, title))
        assert len(steps) >= 10, f"'{title}' has {len(steps)} numbered steps"
        bare = [s.splitlines()[0] for s in steps if not STEP.search(s)]
        assert not bare, f"'{title}': steps that name no file:function: {bare}"


def test_the_stop_trace_passes_through_every_module_of_both_stop_rooms() -> None:
    """A newcomer looking for where a stop is handled finds both sides in one section."""
    named = set(MODULE.findall(section(page(), "A stop")))
    rooms = {m for m in modules_on_disk() if m.startswith(("runner/supervise/stop/", "tasks/engine/stop/"))}
    assert rooms and not rooms - named, f"the stop trace leaves out {sorted(rooms - named)}"


def test_the_page_says_what_each_folder_installs_as() -> None:
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    head = page()[:1000]  # said near the top
    for package, folder in package_dir.items():
        assert f"`{folder}/` → `{package}`" in head, (folder, package)
