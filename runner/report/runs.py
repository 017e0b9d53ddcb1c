"""``ddp-runs``: the runs and sweeps under an output root, newest first, and ``ddp-runs show DIR`` for one run.

The reading is runner/rundir/listing.py; this module renders it: a rich table on a terminal, plain aligned text
when piped, JSON with ``--json``. ``show`` prints one run's plan, status, root cause and the command that
continues it (``ddp-run resume=<dir>``) or reproduces it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from ddp_runner.console import textfit
from ddp_runner.contract import command_line, console_streams, layout
from ddp_runner.contract.run_files import RunManifest
from ddp_runner.diagnostics import rootcause
from ddp_runner.rundir import checkpoint_list, listing, records
from ddp_runner.rundir import status as run_status
from ddp_runner.rundir.rerun import first_invocation, reproduce_command
from ddp_runner.rundir.resume import NEW_RUN

HEAD = ("RUN", "STATUS", "TASK", "WORLD", "GLOBAL BATCH", "STEP", "LAST LOSS", "THROUGHPUT", "AGE")
# Where the table is wider than the terminal, these columns go, in this order, before the run's name is ever cut:
# the name tells the runs apart, and holds the task and the world size (``<time>_<task>_w<N>``).
DROP_FIRST = ("TASK", "WORLD", "AGE", "THROUGHPUT", "GLOBAL BATCH", "LAST LOSS", "STEP")
# Statuses after which `ddp-run resume=<dir>` continues the run in place.
CONTINUABLE = (layout.STATUS_FAILED, layout.STATUS_INTERRUPTED, layout.STATUS_LOST, listing.STATUS_PREEMPTED,
               layout.STATUS_PRUNED)


# -- cells -----------------------------------------------------------------------------------------------------

def age(started: float | None, now: float) -> str:
    """``45 s``, ``12 min``, ``3 h``, ``2 d`` since ``started`` (``—`` when not known)."""
    if started is None:
        return "—"
    s = max(0.0, now - started)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s // size:.0f} {unit}"
    return f"{s:.0f} s"


def rate(value: float | None, unit: str | None) -> str:
    """``1,624 samples/s``, ``12.3k tokens/s``."""
    if value is None or unit is None:
        return "—"
    if value >= 10_000:
        return f"{value / 1000:,.1f}k {unit}"
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"


def cells(row: listing.Row, now: float, indent: str = "") -> list[str]:
    """The row's cells, in HEAD's order."""
    step = "—" if row.step is None else f"{row.step}/{row.max_steps if row.max_steps is not None else '?'}"
    status = row.status + (f" ({row.note})" if row.kind == "sweep" and row.note else "")
    name = row.name.rsplit("/", 1)[-1] if indent else row.name  # a sweep's job: its own name under the sweep
    return [indent + name, status, row.task or "—", _values(row, "world_size"), _values(row, "global_batch"), step,
            "—" if row.last_loss is None else f"{row.last_loss:.4f}", rate(row.throughput, row.unit),
            age(row.started, now) if row.kind != "job" else (row.note or "")[:60]]


def _values(row: listing.Row, key: str) -> str:
    """A run's value of ``key``; a sweep's: its jobs' distinct values (``1,2,4``)."""
    if row.kind == "sweep":
        values = sorted({v for j in row.jobs if (v := getattr(j, key)) is not None})
        return ",".join(map(str, values)) or "—"
    value = getattr(row, key)
    return "—" if value is None else str(value)


def table(rows: Sequence[listing.Row], now: float) -> list[list[str]]:
    """Every row's cells, a sweep's jobs indented under it."""
    out = []
    for r in rows:
        out.append(cells(r, now))
        out += [cells(j, now, "  └ ") for j in r.jobs]
    return out


def kept_columns(body: Sequence[Sequence[str]], width: int | None, gap: int) -> list[int]:
    """The indexes of the columns of ``body`` (the header first) that fit ``width`` columns with ``gap`` between
    them: :data:`DROP_FIRST` go in turn until the table fits (all of them without a width)."""
    keep = list(range(len(HEAD)))
    widths = [max(len(line[i]) for line in body) for i in range(len(HEAD))]
    for name in DROP_FIRST:
        if width is None or sum(widths[i] for i in keep) + gap * (len(keep) - 1) <= width:
            break
        keep.remove(HEAD.index(name))
    return keep


def plain(rows: Sequence[listing.Row], now: float, width: int | None = None) -> str:
    """The table as aligned plain text (piped output), narrowed to ``width`` columns (None: whole)."""
    body = [list(HEAD), *table(rows, now)]
    keep = kept_columns(body, width, 2)
    widths = {i: max(len(line[i]) for line in body) for i in keep}
    return "\n".join("  ".join(line[i].ljust(widths[i]) for i in keep).rstrip() for line in body)


_STYLE = {layout.STATUS_COMPLETED: "green", layout.STATUS_FAILED: "red", layout.STATUS_LOST: "red",
          layout.STATUS_RUNNING: "cyan", layout.STATUS_INTERRUPTED: "yellow", listing.STATUS_PREEMPTED: "yellow",
          layout.STATUS_PRUNED: "magenta"}


def rich_table(rows: Sequence[listing.Row], now: float, file: IO[str], width: int | None = None) -> None:
    """The table with rich, for a terminal."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=file, width=width, force_terminal=True)
    lines = [(r if i == 0 else r.jobs[i - 1], line) for r in rows
             for i, line in enumerate([cells(r, now)] + [cells(j, now, "└ ") for j in r.jobs])]
    # rich draws " │ " between columns and one space at each side
    keep = kept_columns([list(HEAD), *(line for _, line in lines)], console.width - 2, 3)
    t = Table(show_edge=False, header_style="bold")
    for h in (HEAD[k] for k in keep):
        t.add_column(h, no_wrap=h != "RUN", justify="right" if h in ("WORLD", "GLOBAL BATCH", "STEP") else "left")
    for row, line in lines:
        # Text, not markup: a directory named "a[1]" is shown as it is
        t.add_row(*(Text(line[k], style=_STYLE.get(row.status, "") if k == 1 else "") for k in keep))
    console.print(t)


# -- show --------------------------------------------------------------------------------------------------------

def describe(url: str, now: float | None = None, width: int | None = None) -> str:
    """``ddp-runs show``: one run's plan, status, root cause, and the commands that continue or reproduce it,
    fitted to ``width`` columns (None: one line a field, :func:`_fitted`). Raises :class:`listing.Damaged` when
    ``url`` is not a readable run directory."""
    import fsspec

    now = time.time() if now is None else now
    fs, path = fsspec.core.url_to_fs(url)
    path = path.rstrip("/")
    row = listing.read_run(fs, path, url, url, now)
    try:
        manifest = records.read_manifest(fs, path)  # read_run checked it already: only a rewrite since can fail
    except records.DamagedFile as damaged:
        raise listing.Damaged(f"{layout.MANIFEST}: {damaged.problem}") from None
    try:
        summary = records.read_summary(fs, path) or {}
    except records.DamagedFile:  # only the root cause goes unsaid (ddp-compare names the damage)
        summary = {}
    plan = manifest.get("plan") or {}
    lines = [("run", url), ("status", _status_line(row, manifest, now)), ("task", row.task or "—"),
             ("plan", f"{plan.get('explanation', '—')}; device {plan.get('device')}, backend {plan.get('backend')}"
                      f", {plan.get('nnodes', 1)} node{'s' if plan.get('nnodes', 1) != 1 else ''}"),
             ("progress", _progress(row, now))]
    ckpts = checkpoint_list.of_run(fs, path)
    ckpt = ckpts.newest
    lines.append(("checkpoint", f"{ckpt} (newest complete)" if ckpt else "none complete"))
    # what a resume and ddp-export pass over, said here too
    lines += [("", note) for note in (*ckpts.failed_notes(), *ckpts.notes())]
    cause = summary.get("root_cause") if isinstance(summary, dict) else None
    if isinstance(cause, dict) and cause:
        lines.append(("root cause", f"{rootcause.headline(cause)} (where: {cause.get('where')})"))
    elif isinstance(manifest.get("finalize_error"), dict):
        fe = manifest["finalize_error"]
        lines.append(("root cause", f"the driver failed while finalising ({fe.get('while')}): {fe.get('error')}"))
    if row.status in CONTINUABLE:
        lines.append(("continue", _continue(fs, path, row.url, ckpt)))
    first = first_invocation(manifest)
    command = None if first is None else reproduce_command(first)
    lines.append(("reproduce", command or ("— (run.json records no invocation)" if first is not None else
                                           "— (run.json records only the command that continued it)")))
    lines.append(("logs", layout.join(row.url, layout.LOGS)))
    w = max(len(k) for k, _ in lines)
    return "\n".join(part for k, v in lines for part in _fitted(k, v, w, width))


PATH_FIELDS = ("run", "logs")  # a path a user copies: left whole, alone on its line
COMMAND_FIELDS = ("continue", "reproduce")


def _fitted(key: str, value: str, w: int, width: int | None) -> list[str]:
    """One field of ``ddp-runs show`` as lines of ``width`` columns: its value wrapped under its column; a path
    too wide goes whole on a line of its own, and a command on its own lines continued with backslashes, with
    what it does (its ``# …``) after the field's name, so that it still pastes."""
    line = f"{key:<{w}}  {value}"
    if width is None or len(line) <= width:
        return [line]
    under = " " * (w + 2)
    if key in PATH_FIELDS:
        return [key, f"{under}{value}"]
    if key in COMMAND_FIELDS and value.startswith(("ddp-run ", "cd ")):
        command, _, note = value.partition("    # ")
        return [*textfit.wrap(f"{key:<{w}}  {note}".rstrip(), width, under=w + 2),
                *textfit.wrap(f"{under}{command}", width)]
    return textfit.wrap(line, width, under=w + 2)


def _continue(fs: Any, path: str, url: str, ckpt: str | None) -> str:
    """The command that continues the run in place, where a resume accepts it: from its newest checkpoint, or
    from the checkpoint it started from (its ``resume``); a run with neither would start from step 0, which a
    resume refuses: the reproduce command starts it again."""
    if ckpt:
        return f"{command_line.resume(url)}    # in place, from {ckpt}"
    try:
        source = str(records.read_config(fs, path, complete=False).get("resume", "auto"))
    except records.DamagedFile:
        source = "auto"
    if source not in NEW_RUN:
        return f"{command_line.resume(url)}    # in place, from {source} (the checkpoint it started from)"
    return "— no complete checkpoint to continue from: start it again from step 0 (reproduce)"


def _progress(row: listing.Row, now: float) -> str:
    if row.step is None and row.last_loss is None:
        return "no optimizer step recorded"
    step, loss, speed = cells(row, now)[5:8]
    return f"step {step}, last loss {loss}, {speed}"


def _status_line(row: listing.Row, manifest: RunManifest, now: float) -> str:
    recorded = manifest.get("status")
    if row.status == layout.STATUS_LOST and recorded == layout.STATUS_RUNNING:
        return (f"lost: run.json says running, but its driver is gone ({run_status.describe_driver(manifest, now)})"
                "; it ended without a final status (killed, or its host died)")
    if row.status == layout.STATUS_RUNNING:
        return f"running: driver {run_status.describe_driver(manifest, now)}"
    ended = manifest.get("ended")
    return f"{row.status}" + (f" (ended {ended})" if ended else "")


# -- the command ---------------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ddp-runs", description="List the runs and sweeps under an output root, newest first "
        "(status, task, world size, global batch, step reached, last loss, throughput, age); "
        "'ddp-runs show DIR' prints one run's plan, status, root cause and the command that continues or "
        "reproduces it.",
        epilog="Examples: ddp-runs · ddp-runs s3://bucket/outputs · ddp-runs --json · "
        "ddp-runs show outputs/2026-12-01/12-00-00_smoke_w2")
    p.add_argument("words", nargs="*", metavar="ROOT | show DIR",
                   help="the output root to list (default: outputs; output.root=ROOT as ddp-run takes it works too),"
                   " or 'show' and one run directory")
    p.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    return p


def _error(msg: str, fix: str) -> int:
    textfit.say(f"ddp-runs: error: {msg}. Fix: {fix}", sys.stderr)
    return 2


_KEY_FORM = re.compile(r"^\+?([A-Za-z_][\w.]*)=(.*)$")  # ddp-run's key=value (a URL has its :// before any =)


def root_word(word: str, exists: Callable[[str], bool] = os.path.exists) -> str:
    """The output root a ``ddp-runs`` word names: a path or URL as given, or ``output.root=<root>`` as ``ddp-run``
    takes it. ValueError for another ``key=value`` (ddp-runs lists one root; it filters nothing). A folder that
    really has such a name is taken as it is."""
    m = _KEY_FORM.match(word)
    if m is None or exists(word):
        return word
    if m.group(1) == "output.root" and m.group(2):
        return m.group(2)
    raise ValueError(f"ddp-runs takes an output root (a path or URL, or output.root=<root>), not {word}")


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``ddp-runs``: 0 on success, 2 on a bad root or run directory."""
    console_streams.guard()  # a closed pipe or an ASCII console never ends it (docs/run-tree.md)
    args = _parser().parse_args(argv)
    words, now = list(args.words), time.time()
    if words[:1] == ["show"]:
        if len(words) != 2:
            return _error("'show' takes one run directory", "ddp-runs show outputs/<date>/<time>_<task>_w<N>")
        if _KEY_FORM.match(words[1]) and not os.path.exists(words[1]):
            return _error(f"'show' takes a run directory (a path or URL), not {words[1]}",
                          "ddp-runs show outputs/<date>/<time>_<task>_w<N>; ddp-runs ROOT lists them")
        return _show(words[1], args.json, now)
    if len(words) > 1:
        return _error(f"one root at a time, got {len(words)}", "ddp-runs ROOT, or ddp-runs show DIR")
    try:
        root = root_word(words[0]) if words else "outputs"
    except ValueError as exc:
        return _error(str(exc), "ddp-runs /path/to/outputs, or ddp-runs output.root=/path/to/outputs")
    try:
        found = listing.scan(root, now)
    except FileNotFoundError:
        return _error(f"{root}: no such directory", "pass the output root your runs went to (output.root), "
                      "e.g. ddp-runs outputs")
    except (OSError, ValueError, ImportError) as exc:
        return _error(f"{root} cannot be read ({type(exc).__name__}: {str(exc)[:200]})",
                      "check the path or URL and its credentials")
    for name, why in found.skipped:
        textfit.say(f"ddp-runs: skipped {name}: {why}", sys.stderr)
    if args.json:
        print(json.dumps({"root": root, "runs": [r.to_json() for r in found.rows],
                          "skipped": [{"name": n, "reason": w} for n, w in found.skipped]}, indent=2))
    elif not found.rows:
        textfit.say(f"ddp-runs: no runs under {root}")
    elif sys.stdout.isatty():
        try:
            rich_table(found.rows, now, sys.stdout, textfit.terminal_width(sys.stdout))
        except ImportError:
            print(plain(found.rows, now, textfit.terminal_width(sys.stdout)))
    else:
        print(plain(found.rows, now, textfit.terminal_width(sys.stdout)))
    return 0


def _show(url: str, as_json: bool, now: float) -> int:
    try:
        if as_json:
            import fsspec

            fs, path = fsspec.core.url_to_fs(url)
            print(json.dumps(listing.read_run(fs, path.rstrip("/"), url, url, now).to_json(), indent=2))
        else:
            print(describe(url, now, textfit.terminal_width(sys.stdout)))
    except listing.Damaged as why:
        if listing.is_sweep(url):
            return _error(f"{url} is a sweep, not one run", f"ddp-runs {shlex.quote(url)} lists its jobs; show one "
                          "of them")
        if str(why).startswith(layout.MANIFEST) and "not a ddp-run manifest" not in str(why):  # damaged
            return _error(f"{layout.join(url, layout.MANIFEST)}: damaged ({why})",
                          records.fix_for(layout.MANIFEST, url))
        return _error(f"{url}: not a run directory ({why})", "pass a run directory (one holding run.json); "
                      "ddp-runs lists them")
    except FileNotFoundError:
        return _error(f"{url}: no such run directory", "ddp-runs lists the run directories under outputs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
