"""The root cause of a failed run, classified: one record for the earliest real failure, the rest as consequences.

Evidence, most structured first: each rank's error record (``logs/rank<R>.error.json``: exception type, message,
time, traceback tail), the watchdog's hang record and its watch over the rank processes (which ended when, exit
code where it could read it, the cgroup's OOM-kill count), each rank's last progress (``terminated`` when it was
stopped by SIGTERM), and torchrun's per-rank exit codes.

Classes: ``oom`` (out of memory, or killed by the kernel's OOM killer), ``exception``, ``signal`` (killed by a
signal), ``hang`` (the watchdog), ``collective_timeout``, ``peer_lost``, ``launcher_error`` (torchrun failed with no
rank to blame), ``interrupted`` (Ctrl-C / SIGTERM to the driver). A collective timeout, a lost peer or a rank
stopped by SIGTERM are what *other* ranks see of a failure: they are the cause only when nothing else failed.

Pure functions over already-read evidence (standard library only).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from typing import Any

from ddp_runner.contract import layout

PRIMARY = ("hang", "oom", "exception", "signal")
_OOM = re.compile(r"out of memory|OutOfMemory", re.I)
_PEER_LOST = re.compile(r"connection (closed|reset) by peer|broken pipe|remote process exited|communicator was"
                        r" aborted|ProcessGroupNCCL is aborted|peer.*(closed|lost|gone)|DistNetworkError",
                        re.I)
_TIMEOUT = re.compile(r"timed? ?out|timeout", re.I)
_WHERE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def classify_error(err: Mapping[str, Any]) -> str:
    """The class of a rank's own error record (an exception it raised)."""
    text = f"{err.get('type', '')}: {err.get('message', '')}"
    if _OOM.search(text):
        return "oom"
    if _PEER_LOST.search(text):
        return "peer_lost"
    if _TIMEOUT.search(text):
        return "collective_timeout"
    return "exception"


def _where_in_traceback(lines: list[str]) -> str | None:
    """The innermost frame in the user's or the project's code (not a library's), else the innermost one."""
    found = [m for line in lines for m in [_WHERE.search(line)] if m]
    own = [m for m in found if "site-packages" not in m.group(1) and not m.group(1).startswith("<")
           and "/lib/python3" not in m.group(1)]
    m = (own or found or [None])[-1]
    return f"{m.group(1)}:{m.group(2)} in {m.group(3)}" if m else None


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _at(progress: Mapping[str, Any] | None) -> str:
    if not progress:
        return "before training started"
    return f"after step {progress.get('step')}, in phase {progress.get('phase')}"


def least_step(progress: Mapping[int, Mapping[str, Any]], rank: int) -> tuple[int, int] | None:
    """``(step, by)``: the step ``rank`` completed at least, when the other ranks' records show more than its own
    (None otherwise), and the rank whose record shows it. The ranks of one job step together (every optimizer step
    syncs every rank's gradients), so a rank took part in the sync of the furthest rank's last step: it completed
    the one before. Its own record can trail that far when it is a copy (another node's, mirrored every 15 s into
    an object store, its node lost since) or was never written. Only records of the same start (``start_step``:
    a torchrun restart resumes every rank from one checkpoint) are compared: an earlier attempt's proves nothing."""
    mine = progress.get(rank) or {}
    own = mine.get("step")
    starts = [p.get("start_step") for p in progress.values()]
    start = mine.get("start_step") if mine else max((s for s in starts if isinstance(s, int)), default=None)
    steps = [(p.get("step"), r) for r, p in progress.items()
             if r != rank and isinstance(p.get("step"), int) and p.get("start_step") == start]
    if not steps:
        return None
    peak, by = max(steps, key=lambda t: (t[0], -t[1]))
    least = peak - 1
    return (least, by) if least > max(own if isinstance(own, int) else 0, 0) else None


def reached(progress: Mapping[int, Mapping[str, Any]], rank: int, last: str = "") -> str:
    """Where ``rank`` was, from the freshest record there is: its own last progress (``last``: how to introduce
    it, e.g. ``last reported ``), and the step it completed at least when the other ranks' records show more
    (:func:`least_step`)."""
    prog = progress.get(rank)
    said = f"{last}{_at(prog)}" if prog else _at(prog)
    bound = least_step(progress, rank)
    if bound is None:
        return said
    step, by = bound
    return (f"{said}; it completed at least step {step} (it took part in step {step + 1}'s gradient sync, which"
            f" rank {by} completed)")


def _events(evidence: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One event per failed rank (and the hang), each with class, time, primary or not."""
    errors: Mapping[int, Mapping[str, Any]] = evidence.get("errors") or {}
    progress: Mapping[int, Mapping[str, Any]] = evidence.get("progress") or {}
    facts: Mapping[int, Mapping[str, Any]] = evidence.get("facts") or {}
    watch: Mapping[str, Any] = evidence.get("watch") or {}
    gone: Mapping[int, Mapping[str, Any]] = watch.get("gone") or {}
    codes: Mapping[str, int | None] = evidence.get("exit_codes") or {}
    hang = watch.get("hang")
    stopped = evidence.get("interrupted") is not None
    events: list[dict[str, Any]] = []
    if hang:
        events.append({"rank": hang["rank"], "class": "hang", "time": hang["time"], "primary": True,
                       "type": "hang", "message": hang["message"],
                       "where": f"step {hang.get('step')}, phase {hang.get('phase')}, top frame"
                                f" {hang.get('top_frame') or 'unknown'} (stacks: {hang.get('stacks')})",
                       "traceback": []})
    for r in range(int(evidence.get("world_size", 0))):
        if hang and r == hang["rank"]:
            continue
        err, prog = errors.get(r), progress.get(r)
        if err is not None:
            cls = classify_error(err)
            events.append({"rank": r, "class": cls, "time": err.get("time", float("inf")),
                           "primary": cls in PRIMARY, "type": err.get("type"), "message": err.get("message"),
                           "where": (err.get("where") or _where_in_traceback(err.get("traceback") or [])
                                     or reached(progress, r)),
                           "traceback": err.get("traceback") or []})
            continue
        if (facts.get(r) or {}).get("completed") or (prog or {}).get("phase") == "done":
            continue
        code = (gone.get(r) or {}).get("exit_code")
        code = code if code is not None else codes.get(str(r))
        # A stop asked of the driver reaches a rank that has not yet set its SIGTERM handler (still starting) as
        # SIGTERM's default, death without a record: with no exit code to say otherwise, that is the stop's doing.
        terminated = ((prog or {}).get("phase") == "terminated" or code == -signal.SIGTERM
                      or (code is None and stopped and r in gone))
        if not (terminated or r in gone or (code is not None and code != 0)):
            continue  # no sign of failure on this rank
        name = _signal_name(code) or ("SIGTERM" if terminated else None)
        when = (gone.get(r) or {}).get("time") or (prog or {}).get("since") or float("inf")
        if terminated:
            events.append({"rank": r, "class": "signal", "time": when, "primary": False, "type": "SIGTERM",
                           "message": "stopped by SIGTERM (torchrun or the driver stopping the run)",
                           "where": reached(progress, r), "traceback": []})
            continue
        oom = name == "SIGKILL" and (watch.get("oom_kills") or 0) > 0
        how = f"killed by {name} (exit code {code})" if name else "ended without an error record (killed by a signal?)"
        events.append({"rank": r, "class": "oom" if oom else "signal", "time": when, "primary": True,
                       "type": name or "signal",
                       "message": ("killed by the kernel's OOM killer (SIGKILL; the cgroup's oom_kill count rose)"
                                   if oom else how),
                       # A killed rank says nothing more: its progress file (written at most once a second) is
                       # the last word, and it may trail the moment of death by up to that second.
                       "where": reached(progress, r, "last reported "), "traceback": []})
    return events


def root_cause(evidence: Mapping[str, Any]) -> dict[str, Any] | None:
    """The root cause record, or None when nothing failed.

    ``evidence``: ``world_size``; ``errors``, ``facts``, ``progress`` (rank -> record); ``watch`` (the watchdog's
    observations: hang, gone, oom_kills); ``exit_codes`` (str rank -> code, torchrun's); ``rc`` (torchrun's exit
    code); ``interrupted`` (the signal that stopped the driver, or None); ``agent_tail`` (torchrun's last log lines).
    """
    events = _events(evidence)
    primary = [e for e in events if e["primary"]]
    interrupted = evidence.get("interrupted")
    if primary:
        first = min(primary, key=lambda e: e["time"])
    elif interrupted is not None:
        first = {"rank": None, "class": "interrupted", "time": 0, "type": "Interrupted",
                 "message": f"interrupted by signal {interrupted}", "where": "the driver", "traceback": []}
    elif events:
        first = min(events, key=lambda e: e["time"])
    elif evidence.get("rc", 0) != 0:
        tail = list(evidence.get("agent_tail") or [])
        said = next((line for line in reversed(tail) if "Error" in line or "error" in line), tail[-1] if tail else "")
        said = said.strip() or f"its own log ({layout.AGENT_LOG}) is empty or missing"
        first = {"rank": None, "class": "launcher_error", "time": 0, "type": "LauncherError",
                 "message": f"torchrun exited with {evidence.get('rc')} and no rank left a record: {said}",
                 "where": "torchrun", "traceback": tail[-12:]}
    else:
        return None
    others = sorted((e for e in events if e is not first), key=lambda e: (e["time"], e["rank"]))
    return {
        "rank": first["rank"], "class": first["class"], "message": first["message"], "where": first["where"],
        "type": first["type"], "traceback": first["traceback"],
        "consequences": [{"rank": e["rank"], "class": e["class"], "message": str(e["message"])[:300]}
                         for e in others],
        "other_failed_ranks": sorted({e["rank"] for e in others if e["rank"] is not None}),
    }


# Errors of the system underneath that a library's own message hides (torch.save on a full disk raises
# "[enforce fail at inline_container.cc] . unexpected pos …"; the rank log holds the OS's word for it).
_OS_ERRORS = {"No space left on device": "the disk holding the run directory (or the temporary folder) is full",
              "Disk quota exceeded": "the disk quota of the run directory's filesystem is used up",
              "Read-only file system": "the run directory's filesystem is read-only"}


def with_os_error(cause: dict[str, Any], logs: Mapping[int, str]) -> dict[str, Any]:
    """``cause`` with the OS error its rank's log names (a full disk…) put first in its message, when the message
    itself does not say it; unchanged otherwise."""
    text = logs.get(cause.get("rank")) if isinstance(cause.get("rank"), int) else None
    message = str(cause.get("message") or "")
    for words, meaning in _OS_ERRORS.items():
        if text and words in text and words not in message:
            return {**cause, "message": f"{words} ({meaning}); the error raised: {message}"}
    return cause


def headline(cause: Mapping[str, Any]) -> str:
    """The console's one line naming the rank and the cause: ``earliest error on rank 1 [hang]: …``."""
    who = f"rank {cause['rank']}" if cause.get("rank") is not None else "the launcher"
    return f"earliest error on {who} [{cause.get('class')}]: {cause.get('type')}: {cause.get('message')}"


def frames(traceback: list[str], most: int = 3) -> list[str]:
    """The last ``most`` whole frames of a recorded traceback tail: each ``File …`` line with its source line, the
    ``^^^`` markers left out; never a fragment that starts inside a frame, never the exception line (the cause line
    says it). [] when the tail holds no frame (torchrun's log lines, a hang)."""
    starts = [i for i, line in enumerate(traceback) if line.startswith('  File "')]
    out: list[str] = []
    for i in starts[-most:]:
        out.append(traceback[i])
        for line in traceback[i + 1:]:
            if not line.startswith("    ") or line.startswith('  File "'):
                break
            if line.strip(" ^~"):
                out.append(line)
    return out


def account(cause: Mapping[str, Any], label: str, log: str | None = None) -> list[str]:
    """A failed run's account of its cause, said once and first: the line naming the rank and the error, where in
    the user's code it came from, then the last whole frames of its traceback (``log``: the rank log that holds
    all of it), or the launcher's last log lines."""
    lines = [f"{label}: {headline(cause)}"]
    if cause.get("where"):
        lines.append(f"  where: {cause['where']}")
    tail = [str(line) for line in cause.get("traceback") or []]
    found = frames(tail)
    if found:
        lines += [f"  its last frames{f' (the whole traceback: {log})' if log else ''}:", *(f"  {ln}" for ln in found)]
    elif tail:
        lines += [f"    {line}" for line in tail[-6:]]
    return lines


def consequence_lines(cause: Mapping[str, Any], most: int = 8) -> list[str]:
    """What followed on other ranks, one line each."""
    said = str(cause.get("message"))
    return [f"then rank {c['rank']}: {c['class']}: "
            + ("the same error" if str(c.get("message")) == said else str(c.get("message"))[:160])
            for c in cause.get("consequences", [])[:most]]
