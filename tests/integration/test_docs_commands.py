"""Every command of README.md and docs/*.md does what the page says (tests/support/doc_commands.py finds them):

- ``ddp-run …`` composes, validates and plans, as a dry run through ``main()`` in process (nothing is launched),
  in the folder the page's ``cd`` lines lead to; a command marked ``# refused`` is refused (exit 2); after a
  ``$ `` prompt, it prints the lines the page shows;
- ``ddp-tokenize`` runs for real when its input exists there (the next ``ddp-run`` reads what it wrote);
- every other tool of the product takes the options the page gives it (its ``--help`` names them);
- ``make`` names a target of the Makefile.

The GPUs are a fake nvidia-smi's two H200s (tests/support/fake_smi.py), so that a GPU command plans as on a GPU
host, memory plan included; ``device=cpu`` commands plan on the CPU. Each page's commands run in a scratch folder
that mirrors the checkout (one symbolic link per top-level entry), so that a command that writes
(``ddp-tokenize --out my-tokens``) writes there. Pages that arrive later are covered as they are: nothing here
names a page."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.doc_commands import ROOT, Command, commands, make_targets, pages, scripts, shown_files
from tests.support.driver import cli_in_process

INFO = ("--help", "-h", "--cfg", "--info", "-sc", "--shell-completion", "--version", "--hydra-help")


def _scratch(tmp: Path, page: Path) -> Path:
    """Where the page's commands run: a page that shows the user's files (a project) runs in an empty folder
    holding only those files, as the user would; any other page in a mirror of the checkout."""
    work = tmp / "checkout"
    work.mkdir()
    if files := shown_files(page):
        for name, body in files.items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_text(body)
        return work
    for entry in ROOT.iterdir():
        if entry.name not in (".git", "outputs", "site", ".venv"):
            (work / entry.name).symlink_to(entry)
    return work


def _project_commands() -> set[tuple[str, ...]]:
    """Commands of the pages that show a project's files: another page may repeat them (README's own-task
    section), and they are checked on their own page, beside those files."""
    return {c.argv for p in pages() if shown_files(p) for c in commands(p)}


def _tool(name: str, argv: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """A console script's ``main(argv)`` in process, in ``cwd``: its exit code and what it printed."""
    module, func = scripts()[name].split(":")
    main = getattr(importlib.import_module(module), func)
    out = io.StringIO()
    monkeypatch.chdir(cwd)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code or 0, out.getvalue()


def _seed_unfinished(root: Path, finished: Path) -> Path:
    """An interrupted run under ``root`` (a copy of a real completed one, its status rewound), for the commands
    that continue the latest unfinished run (``resume=last``)."""
    run = root / "2026-01-01" / "00-00-00_smoke_w2"
    shutil.copytree(finished, run)
    record = json.loads((run / "run.json").read_text())
    record["status"] = "interrupted"
    (run / "run.json").write_text(json.dumps(record))
    return run


def _check_ddp_run(cmd: Command, cwd: Path, root: Path, monkeypatch: pytest.MonkeyPatch,
                   finished: Path) -> str | None:
    args = list(cmd.argv[1:])
    seeded = [_seed_unfinished(root, finished) / "run.json"] if "resume=last" in args else []
    if not any(a in INFO for a in args) and not any(a.startswith("dry_run=") for a in args):
        args.append("dry_run=true")
    r = cli_in_process(args, root, monkeypatch, cwd=cwd)
    want = 2 if cmd.refused else 0
    if r.returncode != want:
        return f"{cmd}: exit {r.returncode}, expected {want}\n{r.stdout[-1500:]}{r.stderr[-1500:]}"
    printed = {ln.strip() for ln in (r.stdout + r.stderr).splitlines()}
    if missing := [ln for ln in cmd.output if ln not in printed]:
        return f"{cmd}: the page shows lines it did not print: {missing}\n{r.stdout[-1500:]}{r.stderr[-1500:]}"
    if [p for p in root.rglob("run.json") if p not in seeded]:
        return f"{cmd}: a dry run left a run directory under {root}"
    return None


def _check_tool(cmd: Command, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> str | None:
    name, args = cmd.argv[0], list(cmd.argv[1:])
    if name == "ddp-tokenize" and args and (cwd / args[0]).exists():
        code, out = _tool(name, args, cwd, monkeypatch)
        return None if code == 0 else f"{cmd}: exit {code}\n{out[-1500:]}"
    code, usage = _tool(name, ["--help"], cwd, monkeypatch)
    flags = [a.split("=", 1)[0] for a in args if a.startswith("-")]
    unknown = [f for f in flags if f not in usage]
    if code != 0 or unknown:
        return f"{cmd}: {name} --help exit {code}; options it does not know: {unknown}"
    return None


def _check(cmd: Command, work: Path, root: Path, monkeypatch: pytest.MonkeyPatch, finished: Path) -> str | None:
    cwd = (work / cmd.cwd).resolve() if cmd.cwd != "." else work
    if not cwd.is_dir():
        return f"{cmd}: no folder {cmd.cwd} in the checkout"
    if cmd.argv[0] == "make":
        missing = [t for t in cmd.argv[1:] if "=" not in t and t not in make_targets()]
        return f"{cmd}: no Makefile target {missing}" if missing else None
    if cmd.argv[0] == "ddp-run":
        return _check_ddp_run(cmd, cwd, root, monkeypatch, finished)
    return _check_tool(cmd, cwd, monkeypatch)


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_command_of_the_page_works_as_written(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    fake_smi: Path, smoke_reference: Path) -> None:
    """Planned as on the host the pages describe: two H200s (a fake nvidia-smi); device=cpu commands use none."""
    found = commands(page)
    if not shown_files(page):
        found = [c for c in found if c.argv not in _project_commands()]
    work = _scratch(tmp_path, page)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    failures = []
    for i, cmd in enumerate(c for c in found if not c.template):
        with monkeypatch.context() as mp:
            if (problem := _check(cmd, work, tmp_path / f"outputs{i}", mp, smoke_reference)) is not None:
                failures.append(problem)
    assert not failures, "\n\n".join(failures)


def test_the_pages_hold_commands_and_few_templates() -> None:
    """The finder finds the commands (a test of nothing would pass), and templates stay the exception."""
    found = [c for p in pages() for c in commands(p)]
    run = [c for c in found if c.argv[0] == "ddp-run" and not c.template]
    assert len(run) >= 20, [str(c) for c in run]
    assert any(c.refused for c in run)
    assert any(c.cwd != "." for c in run)
    templates = [str(c) for c in found if c.template]
    assert len(templates) <= len(found) // 4, templates
