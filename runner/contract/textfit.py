"""Text the tools print, fitted to the terminal: lines wrapped at word boundaries under a hanging indent, commands
continued with ``\\`` so that they still paste. Stdlib only, in the contract, so that the worker side's commands
(``ddp-export``) fit their lines by the same rule as the driver's (whose face is runner/console/textfit.py, with
its tables).

The width, one rule for every tool and the live bar (:func:`terminal_width`): a terminal's own width, which follows a
resize (``COLUMNS``, else 80, only where a terminal's size cannot be read). Output that is no terminal (piped to a
file, a CI log, another program) is never changed, whatever ``COLUMNS`` says, as ``ls`` prints one name a line when
piped: one record per line, for grep and scripts (and a ``COLUMNS`` exported by a parent that loaded readline, as
Python's REPL and pytest do, never reflows a log). A path printed alone on its line (the run directory, last, for
scripts) is left whole: the terminal folds it, and a copy of it stays one path."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Sequence
from typing import IO, Any

INDENT = "  "  # a wrapped line's continuation, under the ``ddp-run:`` it continues
NOTE_ROOM = 30  # a table's notes (``most work, at its power limit``) wrap in no fewer columns


MIN_WIDTH = 20  # narrower than this, nothing readable fits: lines are left as they are
# A command printed on a line of its own, indented under the sentence that offers it (``  ddp-run resume=<dir>``).
_COMMAND = re.compile(r"^ +(?:ddp-run|ddp-runs|ddp-compare|ddp-export|ddp-doctor|ddp-tokenize|cd|env) ")
# A shell word: quoted parts and other characters up to a space outside quotes.
_SHELL_WORD = re.compile(r"""(?:'[^']*'|"(?:\\.|[^"\\])*"|[^\s'"])+""")
# A line of two columns (``  train.lr   0.001 …``, ``  key:   value``): its first column and the gap after it.
_TWO_COLUMNS = re.compile(r"^ *\S(?:.*?\S)? {2,}(?=\S)")


def terminal_width(stream: IO[str] | None = None) -> int | None:
    """The columns lines printed on ``stream`` (default: stdout) are fitted to: the terminal's own width (where it
    cannot be read, ``COLUMNS``, else 80); None when ``stream`` is no terminal (lines are left whole)."""
    stream = stream if stream is not None else sys.stdout
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        columns = 0
    env = os.environ.get("COLUMNS", "").strip()
    return columns or (int(env) if env.isdigit() and int(env) > 0 else 80)


class _Wrapper(textwrap.TextWrapper):
    """textwrap's, except that a word too long for a line (a path, a URL) is broken after a ``/`` where it can be,
    not at any letter."""

    def _split(self, text: str) -> list[str]:
        room = self.width - len(self.subsequent_indent)
        out: list[str] = []
        for chunk in super()._split(text):
            out += _at_slashes(chunk, room) if len(chunk) > room and not chunk.isspace() else [chunk]
        return out


def _at_slashes(word: str, room: int) -> list[str]:
    """``word`` in pieces of at most ``room`` columns, each ending after a ``/`` where one is in reach."""
    pieces, rest = [], word
    while len(rest) > room:
        cut = rest.rfind("/", 0, room) + 1
        cut = cut if cut > room // 3 else room  # no slash in reach: cut the word
        pieces.append(rest[:cut])
        rest = rest[cut:]
    return [*pieces, rest] if rest else pieces


def wrap(line: str, width: int | None, under: int | None = None) -> list[str]:
    """``line`` as lines of at most ``width`` columns, broken at word boundaries, each continuation under a hanging
    indent (the line's own indent and two columns more, or its second column's where it has two and that leaves
    ``NOTE_ROOM`` columns); ``[line]`` without a width. A word longer than a line (a path) is broken after a ``/``:
    the terminal would break it anywhere. A command on a line of its own (``  ddp-run …``) is continued as
    :func:`command` continues it, so that it still pastes (one with a comment is left whole). ``under``: the column
    the continuations start at instead, where the caller knows a table's last column (it is kept while that leaves
    ``NOTE_ROOM`` columns)."""
    if width is None or len(line) <= width or width < MIN_WIDTH:
        return [line]
    lead = line[:len(line) - len(line.lstrip(" "))]
    if _COMMAND.match(line):  # continued with backslashes, so that it still pastes
        words = _SHELL_WORD.findall(line)
        if "#" in words:  # a comment ends at a line's end, and what follows it would run: left whole
            return [line]
        if " ".join(words) == line.strip():  # else not one command (a usage line of two columns)
            return command(words, width, lead)
    hang = (lead + INDENT)[:width // 2]
    if (two := _TWO_COLUMNS.match(line)) and two.end() + NOTE_ROOM <= width:
        hang = " " * two.end()  # under the second column
    if under is not None and under + NOTE_ROOM <= width:
        hang = " " * under
    wrapper = _Wrapper(width, initial_indent=lead, subsequent_indent=hang, break_long_words=True,
                       break_on_hyphens=False, drop_whitespace=True)
    return wrapper.wrap(line.strip(" ")) or [line[:width]]


def wrap_all(lines: Sequence[str], width: int | None) -> list[str]:
    """Every line of ``lines`` wrapped to ``width``."""
    return [part for line in lines for part in wrap(line, width)]


def fit_prose(text: str, width: int | None) -> list[str]:
    """The lines of a Markdown report (``text``) for a terminal of ``width`` columns: its prose wrapped, its table
    rows (``| … |``) and fenced blocks left whole, since a table broken across lines no longer reads as one (and a
    terminal shows it whole in a wider window)."""
    out: list[str] = []
    fenced = False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        out += [line] if fenced or line.startswith(("|", "```")) else wrap(line, width)
    return out


def fit_lines(text: str, width: int | None) -> list[str]:
    """Every line of ``text`` (which may hold several) wrapped to ``width`` columns (None: as they are)."""
    return wrap_all(text.split("\n"), width)


def say(text: str, stream: IO[str] | None = None, **print_args: Any) -> None:
    """Print ``text`` on ``stream`` (default: stdout) fitted to its width (:func:`terminal_width`)."""
    stream = stream if stream is not None else sys.stdout
    print("\n".join(fit_lines(text, terminal_width(stream))), file=stream, **print_args)


def command(words: Sequence[str], width: int | None, indent: str = INDENT) -> list[str]:
    """A shell command of already quoted ``words`` on lines of at most ``width`` columns, each but the last ending
    in ``\\`` so that the lines paste as one command (one line without a width). A word too long for a line (a
    long path) is continued on a line of its own from column 0, the shell removing the backslash and newline
    there; a single-quoted one, in which the shell would keep them, stays whole."""
    line = indent + " ".join(words)
    if width is None or len(line) <= width or width < MIN_WIDTH:
        return [line]
    out, current = [], indent
    for word in words:
        if current.strip() and len(current) + 1 + len(word) + 2 > width:
            out.append(current + " \\")
            current = indent + INDENT
        current += (" " if current.strip() else "") + word
        if len(current) + 2 > width and "'" not in word:
            *full, current = _continued(current, len(current) - len(word), width - 2)  # room for a " \\"
            out += full
    return [*out, current]


def _continued(line: str, start: int, width: int) -> list[str]:
    """``line``, whose last word begins at ``start``, broken inside that word: after a space or a ``/`` where one
    is in reach (else anywhere but after a backslash), each piece ending in a backslash."""
    out = []
    while len(line) > width:
        room = width - 1
        cut = max(line.rfind(" ", start, room), line.rfind("/", start, room)) + 1
        if cut <= start:
            cut = room if line[room - 1] != "\\" else room - 1
        if cut <= start:
            break
        out.append(line[:cut] + "\\")
        line, start = line[cut:], 0
    return [*out, line]
