"""The driver's closing text fitted to the terminal: prose wrapped, tables narrowed by dropping their least telling
columns. Without a width (output piped to a file or a CI log) nothing is changed: one record per line, for grep."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Sequence
from typing import IO

INDENT = "  "  # a wrapped line's continuation, under the ``ddp-run:`` it continues
NOTE_ROOM = 30  # a table's notes (``most work, at its power limit``) wrap in no fewer columns


def terminal_width(stream: IO[str] | None = None) -> int | None:
    """The columns of the terminal ``stream`` (default: stdout) writes to, None when it is not a terminal."""
    stream = stream if stream is not None else sys.stdout
    try:
        if not stream.isatty():
            return None
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, ValueError, OSError):
        return None


def wrap(line: str, width: int | None) -> list[str]:
    """``line`` as lines of at most ``width`` columns, the continuations indented; ``[line]`` without a width. A
    word longer than the width (a path) stays whole on a line of its own."""
    if width is None or len(line) <= width:
        return [line]
    return textwrap.wrap(line, width, subsequent_indent=INDENT, break_long_words=False, break_on_hyphens=False)


def wrap_all(lines: Sequence[str], width: int | None) -> list[str]:
    """Every line of ``lines`` wrapped to ``width``."""
    return [part for line in lines for part in wrap(line, width)]


def columns(rows: Sequence[Sequence[str]], width: int | None = None, drop: Sequence[str] = (),
            indent: str = INDENT) -> list[str]:
    """``rows`` (the first one the header) as aligned text lines; a row may carry one cell more than the header (a
    note, left unaligned). Where the widest line exceeds ``width``, the columns named in ``drop`` go, in that
    order, until it fits, or until the notes have ``NOTE_ROOM`` columns to wrap in, under themselves."""
    head = list(rows[0])
    keep = list(range(len(head)))
    lines, notes_at = _aligned(rows, keep, indent)
    for name in drop:
        if width is None or max(map(len, lines)) <= width or notes_at + NOTE_ROOM <= width:
            break
        if name in head:
            keep.remove(head.index(name))
            lines, notes_at = _aligned(rows, keep, indent)
    if width is None:
        return lines
    return [part for line in lines for part in
            (textwrap.wrap(line, width, subsequent_indent=" " * notes_at, break_long_words=False)
             if len(line) > width else [line])]


def _aligned(rows: Sequence[Sequence[str]], keep: Sequence[int], indent: str) -> tuple[list[str], int]:
    """The kept columns of ``rows`` aligned, and the column where the notes begin."""
    n = len(rows[0])
    picked = [[row[i] for i in keep if i < len(row)] + list(row[n:]) for row in rows]
    widths = [max(len(row[i]) for row in picked if i < len(row)) for i in range(len(keep))]
    lines = [indent + "  ".join(c.ljust(widths[i]) if i < len(widths) else c for i, c in enumerate(row)).rstrip()
             for row in picked]
    return lines, len(indent) + sum(widths) + 2 * len(widths)
