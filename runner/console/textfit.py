"""The driver's face of text fitting (runner/contract/textfit.py: the rule, lines, commands; shared with the worker
side's commands): the same names, and tables narrowed to the terminal by dropping their least telling columns."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from ddp_runner.contract.textfit import (
    INDENT,
    MIN_WIDTH,
    NOTE_ROOM,
    command,
    fit_lines,
    fit_prose,
    say,
    terminal_width,
    wrap,
    wrap_all,
)

__all__ = ["INDENT", "MIN_WIDTH", "NOTE_ROOM", "columns", "command", "fit_lines", "fit_prose", "say",
           "terminal_width", "wrap", "wrap_all"]


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
