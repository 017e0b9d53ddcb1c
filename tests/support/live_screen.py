"""What a live bar (runner/console/live.py, rich's Live) put on a terminal, read back from the bytes it wrote: the
frames it drew and the lines it printed above them, in order.

rich redraws its live region with ``\\r`` and an erase of the line (``ESC[2K``), preceded by one "cursor up and
erase" (``ESC[1A ESC[2K``) for every extra row the previous frame took: a frame that fits one line never causes
one. A line printed above the bar is written after the erase and followed by the frame again; the display
starts by hiding the cursor (``ESC[?25l``) and ends by showing it (``ESC[?25h``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

REDRAW = re.compile(r"\r((?:\x1b\[2K\x1b\[1A)*)\x1b\[2K")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STEP = re.compile(r"\bstep (\d+)/(\d+)")


@dataclass
class Screen:
    """``events``: ("frame" | "line", text) in the order drawn; ``tall_frames``: how many frames took more than one
    row (rich moved the cursor up to erase them)."""

    events: list[tuple[str, str]] = field(default_factory=list)
    tall_frames: int = 0

    @property
    def frames(self) -> list[str]:
        """Every frame drawn, in order."""
        return [text for kind, text in self.events if kind == "frame"]

    @property
    def lines(self) -> list[str]:
        """Every line printed above the bar, in order."""
        return [text for kind, text in self.events if kind == "line"]


def read(output: str) -> Screen:
    """The live display in ``output`` (what the terminal received: rich's escapes included, ``\\r\\n`` or ``\\n``
    line ends): from the hidden cursor to the cursor shown again."""
    start = output.find("\x1b[?25l")
    end = output.find("\x1b[?25h", start)
    live = output[start + len("\x1b[?25l"): end if end >= 0 else None].replace("\r\n", "\n")
    screen = Screen()
    pieces = REDRAW.split(live)  # text, ups, text, ups, …: the ups erase the frame just before them
    for i in range(0, len(pieces), 2):
        text = ANSI.sub("", pieces[i]).rstrip("\n") if i == len(pieces) - 1 else ANSI.sub("", pieces[i])
        rows = text.split("\n")
        for line in rows[:-1]:
            screen.events.append(("line", line))
        if rows[-1]:
            screen.events.append(("frame", rows[-1]))
        if i + 1 < len(pieces) and pieces[i + 1]:
            screen.tall_frames += 1
    return screen


def step_of(text: str) -> int | None:
    """The step a frame or a printed line shows (``step 16/48``), None when it shows none."""
    m = STEP.search(text)
    return int(m.group(1)) if m else None


def problems(screen: Screen, width: int) -> list[str]:
    """What breaks the live display's rules at ``width`` columns: a frame taller than one row or wider than the
    terminal, and a printed step ahead of the bar drawn right after it (the line's own record must have moved it)."""
    out = [f"{screen.tall_frames} frames took more than one row"] if screen.tall_frames else []
    out += [f"{len(f)} columns: {f!r}" for f in screen.frames if len(f) > width]
    for i, (kind, text) in enumerate(screen.events):
        if kind != "line" or (step := step_of(text)) is None:
            continue
        following = next((t for k, t in screen.events[i + 1:] if k == "frame"), "")
        if (step_of(following) or 0) < step:
            out.append(f"printed {text.strip()!r} while the bar below it showed {following!r}")
    return out
