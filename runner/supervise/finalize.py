"""After torchrun ends: status, exit codes, root cause and summary.json; mirroring for remote roots."""

from __future__ import annotations

import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from ddp_runner.config.plan import Plan
from ddp_runner.console import closing, sweep_view, textfit
from ddp_runner.contract import command_line, layout, stops
from ddp_runner.contract.rules import explain
from ddp_runner.contract.run_files import RunSummary
from ddp_runner.contract.stops import StopRecord
from ddp_runner.rundir import reserve
from ddp_runner.rundir.manifest import completion_check, read_rank_files
from ddp_runner.rundir.run_dir import RunDir
from ddp_runner.supervise.stop import outcome as stop_outcome

# torchrun's failure report: "rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 123)"
_AGENT_FAILURE = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")


def _exit_codes(facts: dict[int, dict], errors: dict[int, dict], agent_log: str, world_size: int,
                ) -> dict[str, int | None]:
    codes: dict[str, int | None] = {str(r): None for r in range(world_size)}
    for r in errors:
        codes[str(r)] = 1
    for m in _AGENT_FAILURE.finditer(agent_log):
        codes[m.group(1)] = int(m.group(2))
    for r, f in facts.items():
        if f.get("completed"):
            codes[str(r)] = 0
    return codes


def finish(rd: RunDir, manifest: dict[str, Any], plan: Plan, rc: int, interrupted: int | None,
           watch: dict[str, Any] | None = None, preempt: int | None = None, lost: str | None = None) -> int:
    """Write the final run.json and summary.json, print the outcome, and return the driver's exit code.

    ``preempt``: the pre-emption signal (a run it stopped ends ``preempted``). A stop the ranks agreed on (every
    rank's facts say ``stopped``) ends ``interrupted``/``preempted`` with no root cause, whether the signal reached
    the driver or a worker; the console names the checkpoint and the command that continues the run. ``lost``: a
    multi-node run's lost peer node, the cause of a stop when this driver was sent no signal
    (runner/launch/node_story.py ``stop_cause``): such a stop ends ``preempted`` and its headline names the node.

    A failure while doing so (a full disk, a lost remote store) never escapes as a traceback: it ends with one
    console line, a non-zero exit code and, where run.json can still be written, ``status: failed`` with
    ``finalize_error``; then the save that failed and the checkpoint to continue from, where there are. The disk
    space held back since the launch (runner/rundir/reserve.py) is freed first, so a disk that filled while the run
    trained still takes run.json. Where even so it cannot be written, the console says that run.json keeps
    ``running`` and that readers see the run as ``lost`` once this driver has exited (runner/rundir/status.py).
    """
    reserve.release(rd)  # the space held back since the launch takes the final records (a full disk too)
    step = ["reading the rank files"]  # what finalising was doing, for the message
    try:
        return _finish(rd, manifest, plan, rc, interrupted, step, watch or {}, preempt, lost)
    except Exception as exc:  # noqa: BLE001 - whatever it was, the driver must end with a true status
        return _finalize_failed(rd, manifest, rc, interrupted, step[0], exc)


def outcome(ok: bool, interrupted: int | None, preempt: int | None = None) -> str:
    """The final status of a run whose workers have ended."""
    if interrupted is not None:
        return stops.stop_status(interrupted, preempt)
    return layout.STATUS_COMPLETED if ok else layout.STATUS_FAILED


def prune_record() -> dict[str, Any] | None:
    """What the sweep's driver said when its pruner stopped this run (a search's trial: ``layout.ENV_PRUNE_REQUEST``
    names the file, written before the stop was sent), or None: then a stop is an interrupt."""
    import json
    import os

    path = os.environ.get(layout.ENV_PRUNE_REQUEST)
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _status(manifest: dict[str, Any], ok: bool, interrupted: int | None, preempt: int | None,
            stopped: dict[str, Any] | None, lost: str | None = None) -> str:
    """The run's final status; a stop a search's pruner asked for (:func:`prune_record`) is ``pruned``, its record
    kept in ``manifest["pruned"]`` (an earlier attempt's is dropped: a continued run ends on its own); a stop a lost
    peer node caused (``lost``) is ``preempted``: the cluster took a node away, whatever signal its agent sent."""
    manifest.pop("pruned", None)
    if stopped is not None and not ok and (pruned := prune_record()) is not None:
        manifest["pruned"] = pruned
        return layout.STATUS_PRUNED
    if stopped is not None and not ok and lost is not None:
        return layout.STATUS_PREEMPTED
    return outcome(ok, interrupted, preempt)


def agreed_stop(facts: dict[int, dict], world_size: int) -> StopRecord | None:
    """The stop every rank reports (``stopped`` in its facts: step, signal, checkpoint), or None."""
    found = [facts.get(r, {}).get("stopped") for r in range(world_size)]
    return found[0] if found and all(found) else None


def resume_lines(rd: RunDir, stopped: dict[str, Any] | None, status: str, full_disk: bool = False) -> list[str]:
    """What the console says after a stop or a failure: what was saved, and the one command that continues
    (``full_disk``: once space is freed on the run directory's disk)."""
    from ddp_runner.rundir.resume import newest_checkpoint

    if stopped is not None:
        return stop_outcome.continue_lines(rd.url, status, stopped)
    newest = newest_checkpoint(rd.url)
    if newest is None:
        return [f"ddp-run: {status}: no checkpoint was committed; this run cannot be continued (start it again;"
                " checkpoint.every_steps=N saves on the way)"]
    how = "Free space on its disk, then continue it with:" if full_disk else "Continue it with:"
    return [f"ddp-run: {status}: the last complete checkpoint is {newest}. {how}", f"  {command_line.resume(rd.url)}"]


def _exit_code(ok: bool, rc: int, interrupted: int | None) -> int:
    if ok:
        return 0
    if interrupted is not None:
        return 128 + interrupted
    return rc if rc > 0 else 1


def fitted_plan(plan: dict[str, Any], fitted: dict[str, Any] | None) -> dict[str, Any]:
    """run.json's plan at the micro-batch ``batch.per_rank=auto`` settled on (the worker's record ``fitted``:
    tasks/engine/micro_fit.py): the same global batch in more, smaller micro-batches. ``plan`` itself without one."""
    if not fitted:
        return plan
    per_rank, accumulation = fitted["chosen"], fitted["accumulation"]
    return {**plan, "per_rank_batch": per_rank, "accumulation": accumulation, "micro_batch": fitted,
            "explanation": explain(plan.get("global_batch", 0), per_rank, plan.get("world_size", 1), accumulation)}


def _finish(rd: RunDir, manifest: dict[str, Any], plan: Plan, rc: int, interrupted: int | None,
            step: list[str], watch: dict[str, Any], preempt: int | None, lost: str | None = None) -> int:
    from ddp_runner.diagnostics import rootcause
    from ddp_runner.diagnostics.watchdog import read_progress

    facts, errors, logs = read_rank_files(rd.local, plan.world_size)
    # torchrun's own log: one, or one per node of a multi-node run (each reports its node's ranks' exit codes)
    agent_logs = [Path(rd.local, layout.AGENT_LOG), *sorted(Path(rd.local).glob(layout.node_agent_log("*")))]
    agent_log = "\n".join(p.read_text(errors="replace") for p in agent_logs if p.exists())
    check = completion_check(logs, plan.world_size)
    # The hang watchdog ends a hung run with torchrun's SIGTERM: ranks that took it as a stop saved a checkpoint,
    # but the run failed (a hang), and its root cause says so.
    stopped = None if (watch or {}).get("hang") else agreed_stop(facts, plan.world_size)
    if stopped is not None and interrupted is None:  # the stop reached a worker, not this driver
        interrupted = stopped["signal"]
    else:
        lost = None  # this driver's own stop (or none): a lost peer did not cause it
    if late := stop_outcome.cut_nothing(stopped, interrupted, facts, check, plan.world_size):  # rc: its SIGTERM's
        manifest["stop_after_the_end"], interrupted = stops.signal_name(interrupted), None
    ok = (rc == 0 or late) and interrupted is None and check["all_completed"]
    exit_codes = _exit_codes(facts, errors, agent_log, plan.world_size)
    cause = None if ok or stopped is not None else rootcause.root_cause({
        "world_size": plan.world_size, "errors": errors, "facts": facts, "watch": watch,
        "progress": read_progress(rd.local, plan.world_size), "exit_codes": exit_codes, "rc": rc,
        "interrupted": interrupted, "agent_tail": agent_log.strip().splitlines()[-12:]})
    if cause is not None:
        cause = rootcause.with_os_error(cause, logs)
    if cause is None and not ok and stopped is None:  # torchrun ended well but some rank did not report completion
        cause = {"rank": None, "class": "launcher_error", "type": "Incomplete", "where": "torchrun",
                 "message": f"torchrun exited with {rc} but not every rank reported completion",
                 "traceback": agent_log.strip().splitlines()[-12:], "consequences": [], "other_failed_ranks": []}
    rank0 = facts.get(0, {})
    manifest.update(
        status=_status(manifest, ok, interrupted, preempt, stopped, lost),
        ended=datetime.now().isoformat(timespec="seconds"),
        exit_codes=exit_codes,
        torchrun_exit_code=rc,
        restarts=max((f.get("restart_count", 0) for f in facts.values()), default=0),
        ranks={str(r): {k: f.get(k) for k in ("host", "node", "device", "device_name", "cuda_visible_devices",
                                              "pid")}
               for r, f in sorted(facts.items())},
    )
    manifest["plan"] = fitted_plan(manifest.get("plan") or {}, (rank0.get("summary") or {}).get("micro_batch"))
    manifest["versions"].update(nccl=rank0.get("nccl"), cuda=rank0.get("cuda"))
    step[0] = f"writing {layout.MANIFEST}"
    rd.write_json(layout.MANIFEST, manifest)
    train = (rank0.get("summary") or {}) if ok or stopped is not None else {}
    summary: RunSummary = {
        "status": manifest["status"],
        "explanation": (manifest.get("plan") or {}).get("explanation") or plan.explanation,  # auto: as fitted
        "global_batch": plan.global_batch,
        "completion": check,
        "root_cause": cause, **({"pruned": manifest["pruned"]} if "pruned" in manifest else {}),
        **{k: v for k, v in train.items() if k != "losses"},
        "losses": train.get("losses"),
    }
    step[0] = f"writing {layout.SUMMARY}"
    rd.write_json(layout.SUMMARY, summary)
    step[0] = "reporting"
    if ok:
        if late:
            textfit.say(stop_outcome.after_the_end_line(manifest["stop_after_the_end"]), sys.stderr, flush=True)
        for line in _closing(rd, manifest, train, check):
            print(line, flush=True)
        return 0
    if stopped is not None:
        return _stopped(rd, manifest, rc, interrupted, stopped, lost)
    label = manifest["status"].upper() if interrupted is not None else "FAILED"
    if sweep_view.in_turn((manifest.get("invocation") or {}).get("sweep")):  # one line: the rest is in the run dir
        textfit.say(closing.job_failed_line(cause, label, manifest["invocation"]["sweep"].get("job"),
                                            layout.join(rd.url, layout.SUMMARY)), sys.stderr, flush=True)
        return _exit_code(ok, rc, interrupted)
    log = layout.join(rd.url, layout.rank_log(cause["rank"])) if isinstance(cause.get("rank"), int) else None
    lines = closing.failed_lines(cause, label, log, layout.join(rd.url, layout.LOGS),
                                 resume_lines(rd, None, manifest["status"], _FULL_DISK in str(cause.get("message"))))
    textfit.say("\n".join(lines), sys.stderr, flush=True)
    return _exit_code(ok, rc, interrupted)


def _stopped(rd: RunDir, manifest: dict[str, Any], rc: int, interrupted: int, stopped: StopRecord,
             lost: str | None) -> int:
    """Say how a stop the ranks agreed on ended (its headline names a lost peer node that caused it, else the
    signal) and what continues it; returns the driver's exit code."""
    status = manifest["status"]
    textfit.say(stop_outcome.lost_peer_line(status, lost, stopped) if lost is not None
                else stop_outcome.stopped_line(status, stops.signal_name(interrupted), stopped), sys.stderr)
    for line in resume_lines(rd, stopped, status):
        textfit.say(line, sys.stderr, flush=True)
    return 0 if "pruned" in manifest else _exit_code(False, rc, interrupted)  # a pruned trial ended well


def _closing(rd: RunDir, manifest: dict[str, Any], train: dict[str, Any], check: dict[str, Any]) -> list[str]:
    """A completed run's closing account, fitted to the terminal: a sweep's job in one line (the sweep's table
    follows at its end); on a terminal, summary.json named in the run directory printed on the last line."""
    width = textfit.terminal_width(sys.stdout)
    sweep = (manifest.get("invocation") or {}).get("sweep")
    if sweep is not None:  # run in turn, it names its run directory (nothing else does)
        return closing.job_line(train, sweep.get("job"), width, rd.url if sweep_view.in_turn(sweep) else None)
    summary = layout.SUMMARY if width is not None else layout.join(rd.url, layout.SUMMARY)
    return closing.completed_lines(train, check, summary, width)


def failed_while(rd: RunDir, manifest: dict[str, Any], step: str, exc: Exception) -> int:
    """A run whose driver failed outside finalising (its run directory became unwritable mid-run: permissions, a
    full disk, a lost store): one console line, ``failed`` in run.json where it can still be written."""
    reserve.release(rd)
    return _finalize_failed(rd, manifest, 1, None, step, exc)


_FULL_DISK = "No space left on device"
_SAVE = re.compile(r"checkpoints/(step_\d+)")


def _failed_save(rd: RunDir) -> str | None:
    """The checkpoint save a rank's error record names (``step_10 (rank 0: CheckpointError: …)``), or None."""
    import json

    for path in sorted(Path(rd.local, layout.LOGS).glob("rank*.error.json")) if rd.local else []:
        try:
            error = json.loads(path.read_text())
            message = str(error.get("message") or "")
        except (OSError, ValueError, AttributeError):
            continue
        if m := _SAVE.search(message):
            return f"{m.group(1)} (rank {error.get('rank')}: {error.get('type')}: {message[:200]})"
    return None


def _full_disk(rd: RunDir, exc: BaseException) -> bool:
    """Did the disk fill: this error, or a rank's log, says so."""
    if _FULL_DISK in str(exc):
        return True
    logs = Path(rd.local, layout.LOGS) if rd.local else None
    return bool(logs) and any(_FULL_DISK in p.read_text(errors="replace") for p in logs.glob("rank*.log"))


def _finalize_failed(rd: RunDir, manifest: dict[str, Any], rc: int, interrupted: int | None, step: str,
                     exc: Exception) -> int:
    """Record (if still possible) and report a failure while finalising: the error and what run.json holds, then
    (where there are) the checkpoint save that failed and the committed checkpoint to continue from. Returns a
    non-zero exit code."""
    error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
    # What run.json holds if it cannot be written now: finalising's own record once it got past writing it, else
    # the launch's (with its heartbeats).
    holds = manifest.get("status") if step in (f"writing {layout.SUMMARY}", "reporting") else layout.STATUS_RUNNING
    written = "as finalising wrote it" if holds != layout.STATUS_RUNNING else "as this launch's start wrote it"
    manifest.update(status=layout.STATUS_FAILED, ended=datetime.now().isoformat(timespec="seconds"),
                    torchrun_exit_code=rc, finalize_error={"while": step, "error": error,
                                                           "interrupted_by": interrupted})
    try:
        rd.write_json(layout.MANIFEST, manifest)
        recorded = f"{layout.MANIFEST} records it"
    except Exception as again:  # noqa: BLE001 - the store is gone: say so, readers will see the run as lost
        recorded = (f"{layout.MANIFEST} could not be updated either ({type(again).__name__}): it still says"
                    f" {holds!r}, {written}" + ("; readers will see the run as lost once this driver has exited"
                                                 if holds == layout.STATUS_RUNNING else ""))
    textfit.say(f"ddp-run: FAILED while finalising ({step}) in {rd.url}: {error}; {recorded}",
                sys.stderr, flush=True)
    try:  # best effort: the account above is already out
        lines = _after_failure(rd, exc)
    except Exception:  # noqa: BLE001 - a store that is gone cannot be listed either
        lines = []
    for line in lines:
        textfit.say(line, sys.stderr, flush=True)
    code = _exit_code(False, rc, interrupted)
    return code if code != 0 else 1


def _after_failure(rd: RunDir, exc: BaseException) -> list[str]:
    """The failed checkpoint save and where the run continues from, when there is either (else nothing: the line
    before says it all)."""
    from ddp_runner.rundir.resume import newest_checkpoint

    failed, newest = _failed_save(rd), newest_checkpoint(rd.url)
    if failed is None and newest is None:
        return []
    full = _full_disk(rd, exc)
    out = [f"ddp-run: the failed save: {failed}" + (" (the disk is full)" if full else "")] if failed else []
    return out + resume_lines(rd, None, layout.STATUS_FAILED, full)
