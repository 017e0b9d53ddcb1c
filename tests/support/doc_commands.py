"""The shell commands of README.md and docs/*.md, as the docs test checks them: every line of a fenced block that
starts with one of the product's tools (``ddp-run``, ``python -m ddp_runner``, a console script of pyproject.toml) or
``make``, with its ``\\`` continuations joined, a leading ``$ `` prompt dropped, and the ``cd`` lines before it in
the same block applied. A command after a ``$ `` prompt must print the lines shown after it. A trailing
``# refused`` comment marks a command that must be refused (exit 2). A command
with a placeholder (``<run dir>``, ``…``) is a template, not a command: it is listed, not run."""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
_PLACEHOLDER = re.compile(r"<[^>]*>|…|\.\.\.")


def pages() -> list[Path]:
    """README.md and every page of the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def shown_files(page: Path) -> dict[str, str]:
    """The files a page shows a user writing: a line ``File `<path>`:`` and the fenced block after it."""
    return dict(re.findall(r"^File `([^`]+)`:\n\n```\w*\n(.*?)^```", page.read_text(), re.M | re.S))


def scripts() -> dict[str, str]:
    """The console scripts pyproject.toml installs: name -> ``module:function``."""
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


@dataclass(frozen=True)
class Command:
    """One command of a page: where it is, the folder it runs in (relative to the checkout) and its words."""

    page: str
    line: int
    cwd: str
    argv: tuple[str, ...]
    refused: bool
    template: bool
    output: tuple[str, ...] = ()  # the lines a ``$ `` prompted command is shown printing, up to the next prompt

    def __str__(self) -> str:
        return f"{self.page}:{self.line} (in {self.cwd}): {shlex.join(self.argv)}"


def _logical_lines(block: str, first: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending, start = "", first
    for n, raw in enumerate(block.splitlines(), first):
        if not pending:
            start = n
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, (pending + line).strip()))
        pending = ""
    return out


def _split_comment(line: str) -> tuple[str, str]:
    """The command and its trailing ``# comment`` (a ``#`` after a space, outside quotes)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i and line[i - 1].isspace():
            return line[:i].rstrip(), line[i + 1:]
    return line, ""


def _shown_output(rest: list[tuple[int, str]]) -> tuple[str, ...]:
    out = []
    for _, line in rest:
        if line.startswith("$ "):
            break
        if line.strip() and line.strip() not in ("…", "..."):  # an elision: lines the page leaves out
            out.append(line.strip())
    return tuple(out)


def commands(page: Path) -> list[Command]:
    """The commands of one page, in order."""
    text = page.read_text()
    tools = {"ddp-run", "make", *scripts()}
    found: list[Command] = []
    for block in _FENCE.finditer(text):
        cwd = "."
        first = text.count("\n", 0, block.start(1)) + 1
        lines = _logical_lines(block.group(1), first)
        for k, (n, line) in enumerate(lines):
            shown = _shown_output(lines[k + 1:]) if line.startswith("$ ") else ()
            line = line.removeprefix("$ ")
            if m := re.fullmatch(r'eval "\$\((.*)\)"(\s+#.*)?', line):
                line = m.group(1)
            code, note = _split_comment(line)
            words = code.split()
            if not words:
                continue
            if words[0] == "cd" and len(words) == 2:
                cwd = str(Path(cwd) / words[1])
                continue
            if words[:3] == ["python", "-m", "ddp_runner"]:
                code = "ddp-run" + code.split("runner", 1)[1]
            elif words[0] not in tools:
                continue
            template = bool(_PLACEHOLDER.search(code))
            argv = tuple(code.split()) if template else tuple(shlex.split(code))
            found.append(Command(page.relative_to(ROOT).as_posix(), n, cwd, argv,
                                 refused="refused" in note, template=template, output=shown))
    return found


def make_targets() -> set[str]:
    """The Makefile's targets."""
    return set(re.findall(r"(?m)^([a-z][\w-]*):", (ROOT / "Makefile").read_text()))
