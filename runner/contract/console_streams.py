"""Console streams that never end the program writing them: the console is never a run's weak point.

A console fails an otherwise healthy program in two ways:

- its reader goes away (``ddp-run … | head``, ``less`` quit early, a ``tee`` that died): Python ignores SIGPIPE, so
  every later write raises ``BrokenPipeError``, the interpreter's flush at exit too ("Exception ignored", exit code
  120);
- it cannot encode a character (``LC_ALL=C``, ``PYTHONIOENCODING=ascii``): ``UnicodeEncodeError`` on a ``×``.

:func:`guard` makes ``sys.stdout`` and ``sys.stderr`` survive both: once the reader has gone, the stream's file
descriptor is pointed at the null device (nobody reads it any more; children started later inherit that) and the
program goes on; a character the encoding lacks is written as its plain ASCII counterpart (``×`` → ``x``, ``…`` →
``...``), or ``?``. Rank 0's console does the same with its rank log as the fallback
(tasks/engine/reporting/progress.py). Standard library only: both sides use it.
"""

from __future__ import annotations

import codecs
import io
import os
import stat
import sys
import threading
import unicodedata
from collections.abc import Callable
from typing import Any, TextIO

ERRORS = "ddp_runner.ascii"  # the codec error handler that writes ASCII counterparts

# What the tools print (and rich draws) that an ASCII console lacks, in plain ASCII.
ASCII = {
    "×": "x", "·": ".", "→": "->", "←": "<-", "—": "-", "–": "-", "−": "-", "…": "...", "⚠": "!", "≥": ">=",
    "≤": "<=", "±": "+/-", "≈": "~", "µ": "u", "°": " deg", "►": ">", "⌈": "ceil(", "⌉": ")", "└": "`-", "†": "+",
    "’": "'", "‘": "'", "“": '"', "”": '"', "✓": "ok", "✗": "x", "•": "*", "━": "-", "╸": "-", "╺": "-", "─": "-",
    "│": "|", "┃": "|",
}
_RANGES = ((0x2500, 0x257F, "-"), (0x2580, 0x259F, "#"), (0x2800, 0x28FF, "*"))  # box, blocks, braille (spinners)


def ascii_of(char: str) -> str:
    """``char`` in plain ASCII: its counterpart in :data:`ASCII`, else its letters without accents (``é`` →
    ``e``), else a box, block or spinner character's shape, else ``?``."""
    if char in ASCII:
        return ASCII[char]
    plain = unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode()
    if plain:
        return plain
    code = ord(char)
    return next((shape for low, high, shape in _RANGES if low <= code <= high), "?")


def _fallback(err: UnicodeError) -> tuple[str, int]:
    if not isinstance(err, UnicodeEncodeError):
        raise err
    return "".join(ascii_of(c) for c in err.object[err.start:err.end]), err.end


codecs.register_error(ERRORS, _fallback)


def lacks_unicode(encoding: str | None) -> bool:
    """Does ``encoding`` miss characters the tools print (every encoding but UTF-8, -16 and -32)?"""
    try:
        return not codecs.lookup(encoding or "ascii").name.startswith("utf")
    except LookupError:
        return True


class _Forgiving(io.FileIO):
    """Writes to a file descriptor whose reader may go away: on a broken pipe ``reroute(fd)`` points the descriptor
    elsewhere, ``note`` is written there once, and writing goes on. ``broken``: the descriptor leads nowhere already
    (the null device), reroute at the first write."""

    def __init__(self, fd: int, reroute: Callable[[int], None], note: str = "", broken: bool = False,
                 keep: Any = None) -> None:
        super().__init__(fd, "w", closefd=keep is None)
        self._reroute_to, self._note, self._broken = reroute, note, broken
        self._keep = keep  # the stream this one replaces: it owns (and at the very end closes) the descriptor
        self._lock = threading.Lock()

    def write(self, data: Any) -> int:
        """Write ``data`` where the descriptor leads, rerouting it first when its reader has gone."""
        if self._broken:
            self._reroute()
        try:
            return super().write(data)
        except BrokenPipeError:
            self._broken = True
            self._reroute()
            return super().write(data)

    def _reroute(self) -> None:
        with self._lock:
            if not self._broken:
                return
            self._reroute_to(self.fileno())
            if self._note:
                os.write(self.fileno(), self._note.encode("utf-8", "replace"))
            self._broken = False


def to_null(fd: int) -> None:
    """Point ``fd`` at the null device (open it there when ``fd`` is closed)."""
    null = os.open(os.devnull, os.O_WRONLY)
    if null != fd:  # else ``fd`` was closed, and the lowest free descriptor is it
        os.dup2(null, fd)
        os.close(null)


def leads_nowhere(fd: int) -> bool:
    """Is ``fd`` the null device (a reader closed before this process started, or ``> /dev/null``)?"""
    try:
        mine, null = os.fstat(fd), os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(mine.st_mode) and mine.st_rdev == null.st_rdev


def forgiving(fd: int, reroute: Callable[[int], None], note: str = "", encoding: str | None = None,
              line_buffering: bool = True) -> TextIO:
    """A text stream on ``fd`` (which it owns and closes) that survives its reader: once that has gone (or when
    ``fd`` is the null device from the start) ``reroute(fd)`` points it elsewhere and ``note`` says so there. A
    character ``encoding`` lacks is written in ASCII."""
    raw = _Forgiving(fd, reroute, note, broken=leads_nowhere(fd))
    encoding = encoding or "utf-8"
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding=encoding, line_buffering=line_buffering,
                            errors=ERRORS if lacks_unicode(encoding) else "strict")


def _guarded(stream: Any) -> Any:
    """``stream`` (the interpreter's own stdout or stderr) made to survive a closed reader and a narrow encoding;
    any other stream (a test's capture, a StringIO) as it is."""
    if not isinstance(stream, io.TextIOWrapper):
        return stream
    buffer = getattr(stream, "buffer", None)
    if isinstance(getattr(buffer, "raw", None), _Forgiving):
        return stream  # guarded already
    try:
        fd = stream.fileno()
        stream.flush()
    except (OSError, ValueError):  # no descriptor, or already closed
        return stream
    raw = _Forgiving(fd, to_null, keep=stream)
    errors = ERRORS if lacks_unicode(stream.encoding) else stream.errors
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding=stream.encoding, errors=errors,
                            line_buffering=stream.line_buffering, write_through=stream.write_through)


def guard() -> None:
    """At a console script's start: ``sys.stdout`` and ``sys.stderr`` survive a reader that goes away and an
    encoding without ``×`` (see the module's docstring). Streams a caller has put there (a test's capture) are
    left alone."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        if stream is None and getattr(sys, f"__{name}__") is None:  # started with it closed (``>&-``)
            to_null(fd)  # a descriptor of its own, not the next file this process (or a child) opens
            stream = open(fd, "w", closefd=False)  # noqa: SIM115 - the interpreter's stream, for its whole life
            setattr(sys, f"__{name}__", stream)
        if stream is getattr(sys, f"__{name}__"):
            setattr(sys, name, _guarded(stream))
