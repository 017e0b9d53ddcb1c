"""One frame of the live bar (runner/console/live.py draws it): its fields, and which of them fit the terminal's width
on one line. Pure functions over the bar's state.

A frame reads ``⠴ mytask · 2 ranks ━━━━━━━╸━━━━ step 16/48 loss 0.1376 · 12,895 samples/s · val loss 0.1153 ·
val accuracy 0.9961 · elapsed 0:12 · ETA 0:03``. Where that is wider than the terminal, fields are dropped in
:data:`DROP_ORDER` (the ETA first, then the rate, the elapsed time, the task's extra validation metrics, the
run's label, the validation loss, the phase, the spinner); the step and the training loss always stay. The bar
takes the columns left over, ``BAR_MIN`` to ``BAR_MAX``; it keeps ``BAR_MIN`` as long as something can be dropped
instead. While rank 0 validates, the frame says so (``validating…``) after the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len

BAR_MIN, BAR_MAX = 10, 40
# Which fields go first when a frame is too wide ("metric": the task's extra validation metrics, the last first).
DROP_ORDER = ("eta", "rate", "elapsed", "metric", "label", "val", "phase", "spinner")
# What the bar says while rank 0 is in a phase other than training (the phase's one name: tasks/engine/validation.py).
PHASES = {"validation": "validating…"}
# The rate's window for the ETA (rank 0's clock): recent steps, so that a slow start-up or a change of pace fades.
ETA_WINDOW_S = 30.0
SEP = " · "  # between the figures; the other fields are separated by one space


@dataclass(frozen=True)
class Field:
    """A piece of a frame: ``key`` says what it is (its place in :data:`DROP_ORDER`; ``bar``: the bar itself,
    whose width :func:`layout` chooses), ``figure``: joined to its neighbour figures by ``SEP``."""

    key: str
    text: str = ""
    figure: bool = False
    style: str = ""


def clock(seconds: float | None) -> str:
    """``1:02:03``, ``2:03``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    m, sec = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def times_text(elapsed: float | None, remaining: float | None, finished: bool) -> str:
    """``elapsed 0:14 · ETA 2:03`` (no ETA before it can be estimated, nor once finished)."""
    out = f"elapsed {clock(elapsed)}"
    return out if finished or remaining is None else f"{out}{SEP}ETA {clock(remaining)}"


def steps_text(step: int, total: int | None) -> str:
    """``step 3/8`` (``step 3`` while the total is unknown)."""
    return f"step {step}/{total}" if total else (f"step {step}" if step else "")


def number(value: float) -> str:
    """A metric's value: four decimals, as the losses have (thousands grouped above 1,000)."""
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:,.1f}"


def metric_text(name: str, value: float) -> str:
    """A task's extra validation metric as the console shows it: ``val accuracy 0.9961``."""
    return f"val {name.removeprefix('val/')} {number(value)}"


def figures(state: Mapping[str, Any]) -> str:
    """The bar's figures with their units, all of them: ``loss 0.7276 · 63,606 tokens/s · val loss 0.7012 ·
    val accuracy 0.9961``."""
    return SEP.join(f.text for f in _figures(state))


def _figures(state: Mapping[str, Any]) -> list[Field]:
    out = []
    if state.get("loss") is not None:
        out.append(Field("loss", f"loss {state['loss']:.4f}", True))
    elif state.get("stage"):  # before the first step: what the start-up is doing
        out.append(Field("stage", f"start-up: {state['stage']}", True))
    if state.get("rate") is not None:
        out.append(Field("rate", f"{state['rate']:,.0f} {state.get('unit') or 'samples/s'}", True))
    if state.get("val") is not None:
        out.append(Field("val", f"val loss {state['val']:.4f}", True))
    out += [Field("metric", metric_text(k, v), True) for k, v in (state.get("metrics") or {}).items()]
    return out


def fields(state: Mapping[str, Any], label: str, elapsed: float | None, remaining: float | None,
           finished: bool) -> list[Field]:
    """Every field of a frame, in the order drawn: spinner (while running), label, bar, step, the phase (while
    validating), figures, times."""
    out = [] if finished else [Field("spinner", "⠿", style="progress.spinner")]
    out += [Field("label", label, style="progress.description"), Field("bar")]
    if (steps := steps_text(state.get("step") or 0, state.get("total"))):
        out.append(Field("steps", steps))
    if not finished and (phase := PHASES.get(state.get("phase") or "")):
        out.append(Field("phase", phase, True, "progress.description"))
    out += _figures(state)
    out.append(Field("elapsed", f"elapsed {clock(elapsed)}", True, "progress.elapsed"))
    if not finished and remaining is not None:
        out.append(Field("eta", f"ETA {clock(remaining)}", True, "progress.elapsed"))
    return out


def pieces(kept: Sequence[Field]) -> list[tuple[str, str, str]]:
    """The frame's pieces with their separators, ``[(key, text, style), …]`` (a separator's key is ``""``; the
    bar's text is empty: its width is :func:`layout`'s)."""
    out: list[tuple[str, str, str]] = []
    previous: Field | None = None
    for f in kept:
        if previous is not None:
            out.append(("", SEP if f.figure and previous.figure else " ", ""))
        out.append((f.key, f.text, f.style))
        previous = f
    return out


def text_width(kept: Sequence[Field]) -> int:
    """Columns of a frame of ``kept`` fields, the bar's own columns left out."""
    return sum(cell_len(text) for _, text, _ in pieces(kept))


def _drops(all_fields: Sequence[Field]) -> list[Field]:
    """The fields in the order they are dropped (metrics: the last shown first)."""
    out: list[Field] = []
    for key in DROP_ORDER:
        out += [f for f in reversed(all_fields) if f.key == key]
    return out


def layout(all_fields: Sequence[Field], width: int) -> tuple[list[Field], int]:
    """The fields that fit ``width`` columns on one line, and the bar's width (0: no bar). Fields are dropped until
    the bar has ``BAR_MIN`` columns; where the step and the loss alone leave less, the bar goes too (and a text
    still too wide is cut by the drawing, which only a terminal a few dozen columns wide sees)."""
    kept = list(all_fields)
    bar = any(f.key == "bar" for f in kept)
    for drop in [None, *_drops(all_fields)]:
        if drop is not None:
            kept.remove(drop)
        room = width - text_width(kept)
        if bar and room >= BAR_MIN:
            return kept, min(room, BAR_MAX)
        if not bar and room >= 0:
            return kept, 0
    return [f for f in kept if f.key != "bar"], 0


def remaining_s(samples: Sequence[tuple[float, int]], total: int | None) -> float | None:
    """Seconds left to ``total`` steps at the pace of ``samples`` (rank 0's ``(time, step)`` of the steps within
    ``ETA_WINDOW_S`` of the last one); None until two of them differ."""
    if not total or len(samples) < 2:
        return None
    (t0, s0), (t1, s1) = samples[0], samples[-1]
    if t1 <= t0 or s1 <= s0:
        return None
    return max(0.0, (total - s1) * (t1 - t0) / (s1 - s0))
