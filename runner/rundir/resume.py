"""Which run a job continues or resumes from, checked before launch: a run directory to continue in place (whose
driver must be gone), or a source of checkpoints (one must be complete, and its run's world size may differ only at
the same global batch)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ddp_runner.config.plan import Plan
from ddp_runner.contract import checkpoints, command_line, layout
from ddp_runner.contract.errors import PlanError
from ddp_runner.rundir import checkpoint_list, records, rerun, resume_keys, status

FIX = "use resume=auto, resume=last, resume=restart, a run directory or a checkpoints/step_<N> path"


def is_run_dir(url: str) -> bool:
    """Is ``url`` a run directory (config.yaml and run.json written)? PlanError when it cannot be read."""
    try:
        fs, path = fsspec.core.url_to_fs(url)
        return fs.exists(layout.join(path, layout.CONFIG)) and fs.exists(layout.join(path, layout.MANIFEST))
    except (OSError, ValueError, ImportError) as exc:
        raise PlanError("resume", url, f"cannot be read ({type(exc).__name__}: {exc})", FIX) from exc


def check_no_live_driver(run_url: str, manifest: dict[str, Any]) -> None:
    """One writer per run directory: refuse to continue a run whose driver is still alive (runner/rundir/status.py);
    a ``lost`` one (its driver killed or its host gone) may be continued."""
    if status.status_of(manifest) == layout.STATUS_RUNNING:
        who = status.describe_driver(manifest)
        raise PlanError("resume", run_url, f"is still running: its driver is {who}; one driver per run directory",
                        f"wait for it to end, or stop it (Ctrl-C, or kill -INT {manifest['driver'].get('pid')}"
                        f" on {manifest['driver'].get('host')}) and resume then. A driver on another host counts as"
                        f" gone {status.STALE_AFTER_S:.0f} s after its last heartbeat (run.json's driver.heartbeat):"
                        " if that host died, resume again after that")


def check_resume_source(resume: str, plan: Plan, conf: dict[str, Any] | None = None) -> dict[str, Any]:
    """Refuse before launch a source that holds no complete checkpoint, a checkpoint from a run with another
    world size (its RNG and data order would not carry over), or (``conf``: this run's planned config) one whose
    run had another value of a key the checkpoint fixes (runner/rundir/resume_keys.py: another model, learning
    rate, optimizer …). Returns the changed keys that apply from the checkpoint's step on (run.json's record)."""
    fix = FIX
    try:
        fs, path = fsspec.core.url_to_fs(resume)
        path = path.rstrip("/")
        if path.endswith("/" + layout.CKPT_STATE):
            path = path.rsplit("/", 1)[0]
        if not fs.exists(path):
            raise PlanError("resume", resume, "no such run directory or checkpoint", fix)
        # A checkpoint counts only once its commit marker exists (see tasks/engine/checkpoint/storage.py), and
        # loads only if its state.pt has the size meta.json records (the workers check its sha256 too). A
        # checkpoint named explicitly must pass; of a directory's, one must (the workers take the newest that does).
        if fs.exists(layout.join(path, layout.CKPT_MARKER)):
            run = path.rsplit("/", 2)[0]  # <run>/checkpoints/step_<N>
            if problem := checkpoint_problem(fs, path):
                raise PlanError("resume", resume, f"fails its integrity check: {problem}",
                                "resume from an older checkpoints/step_<N>, or from the run directory (its newest"
                                " checkpoint that passes is taken)")
        elif (found := checkpoint_list.scan(fs, path)).complete:
            run = path.rsplit("/", 1)[0]  # <run>/checkpoints
        elif found.failed:
            raise PlanError("resume", resume, "holds no checkpoint that passes its integrity check: "
                            + "; ".join(f"{name}: {why}" for name, why in found.failed), fix)
        else:
            why = "; ".join(found.notes()) or "no step_<N>/meta.json"
            raise PlanError("resume", resume, f"holds no complete checkpoint ({why})", fix)
        theirs = records.read_manifest(fs, run)["plan"] if fs.exists(layout.join(run, layout.MANIFEST)) else {}
        ws, global_batch = theirs.get("world_size"), theirs.get("global_batch")
        their_conf = (records.read_config(fs, run, complete=False)
                      if conf is not None and fs.exists(layout.join(run, layout.CONFIG)) else None)
    except records.DamagedFile as damaged:
        raise damaged.refusal() from None
    except PlanError:
        raise
    except (OSError, ValueError, ImportError) as exc:
        raise PlanError("resume", resume, f"cannot be read ({type(exc).__name__}: {exc})", fix) from exc
    # Another world size reshards (the data order carries over: the sampler's strided split consumes a prefix of
    # each epoch); another global batch would be another optimisation problem.
    if problem := checkpoints.world_size_change_problem(ws, global_batch, plan.world_size, plan.global_batch):
        raise PlanError("world_size", plan.world_size, f"the checkpoint's run does not carry over: {problem}",
                        f"resume with world_size={ws}, or keep the global batch: batch.global={global_batch}")
    if their_conf is None or conf is None:
        return {}
    name = path.rsplit("/", 1)[-1]
    step = checkpoints.step_of(name) if name.startswith("step_") else None
    if step is None:
        newest = newest_checkpoint(fs.unstrip_protocol(run) if not isinstance(fs, LocalFileSystem) else run)
        step = checkpoints.step_of(newest) if newest else None
    return resume_keys.check(their_conf, conf, resume, step)


def checkpoint_problem(fs: Any, ckpt_dir: str) -> str | None:
    """Why the checkpoint at ``ckpt_dir`` cannot load, as far as the driver checks (the contract's rules, as
    runner/rundir/checkpoint_list.py applies them: a valid marker, state.pt of the recorded size), naming it; None
    when it passes. The driver never hashes: the workers verify sha256 when they load."""
    name = ckpt_dir.rstrip("/").rsplit("/", 1)[-1]
    verdict, why = checkpoint_list.judge(fs, ckpt_dir)
    return None if verdict == checkpoint_list.COMPLETE else f"{name}: {why}"


# resume values that name no source: auto (a new run; a note names an unfinished one), never and restart (a new run
# from step 0), last (the latest unfinished run under output.root, continued in place).
NEW_RUN = ("auto", "never", "restart")
LAST = "last"
UNFINISHED = (layout.STATUS_INTERRUPTED, layout.STATUS_PREEMPTED, layout.STATUS_PRUNED, layout.STATUS_FAILED,
              layout.STATUS_LOST)


def newest_checkpoint(run_url: str) -> str | None:
    """The name (``step_<N>``) of a run directory's newest committed checkpoint, None when it has none."""
    try:
        fs, path = fsspec.core.url_to_fs(run_url)
        return checkpoint_list.of_run(fs, path).newest
    except (OSError, ValueError, ImportError):
        return None


def skipped_notes(source: str) -> list[str]:
    """The notes for what a resume from ``source`` (a run directory, or its checkpoints folder) passes over in
    its checkpoints folder: a stray file named ``step_<N>``, a save that never committed. Never raises: a source
    that cannot be read gets its refusal elsewhere."""
    try:
        fs, path = fsspec.core.url_to_fs(source)
        path, run = path.rstrip("/"), source.rstrip("/")
        if path.rsplit("/", 1)[-1] == layout.CHECKPOINTS:
            run = run.rsplit("/", 1)[0]
        elif fs.isdir(layout.join(path, layout.CHECKPOINTS)):
            path = layout.join(path, layout.CHECKPOINTS)
        else:
            return []  # a checkpoint named explicitly: it loads or is refused, nothing is passed over
        return [f"{run}: {note}" for note in checkpoint_list.scan(fs, path).notes()]
    except (OSError, ValueError, ImportError):
        return []


def unfinished_runs(root: str, limit: int | None = None) -> list[tuple[str, str, str]]:
    """Runs under output root ``root`` that ended before their last step and hold a checkpoint, newest first (by
    directory name: ``<date>/<time>_…``), as (run url, status, newest checkpoint); at most ``limit`` of them."""
    return list(itertools.islice(iter_unfinished(root), limit))


def iter_unfinished(root: str) -> Iterator[tuple[str, str, str]]:
    """:func:`unfinished_runs`, one at a time: a caller looking for one reads no more run directories than it needs."""
    try:
        fs, path = fsspec.core.url_to_fs(root)
        found = fs.glob(layout.join(path.rstrip("/"), "*", "*", layout.MANIFEST))
        found += fs.glob(layout.join(path.rstrip("/"), "*", layout.MANIFEST))  # multi-node runs sit at the top
    except (OSError, ValueError, ImportError):
        return
    for m in sorted(found, key=lambda m: m.rsplit("/", 3)[-3:-1], reverse=True):
        try:
            manifest = records.read_json(fs, m, "", missing_ok=False)
        except records.DamagedFile:
            continue
        if records.manifest_problem(manifest):
            continue  # damaged: never a run to continue (ddp-runs names it)
        state = status.status_of(manifest)
        run = m.rsplit("/", 1)[0]
        run = run if isinstance(fs, LocalFileSystem) else fs.unstrip_protocol(run)
        if state in UNFINISHED and (ckpt := newest_checkpoint(run)) is not None:
            yield run, state, ckpt


def check_continuable(run_url: str, manifest: dict[str, Any], conf: dict[str, Any], max_steps: int | None) -> None:
    """Refuse to continue a completed run (unless ``max_steps`` raises its train.max_steps above the steps it
    ran: then it continues from its final checkpoint), or a run with no checkpoint to continue from."""
    fs, path = fsspec.core.url_to_fs(run_url)
    try:
        done = (records.read_summary(fs, path.rstrip("/")) or {}).get("steps")
    except records.DamagedFile as damaged:
        raise damaged.refusal() from None
    if manifest.get("status") == layout.STATUS_COMPLETED:
        if max_steps is None or not isinstance(done, int) or max_steps <= done:
            more = 2 * done if isinstance(done, int) and done else "<more steps>"
            raise PlanError("resume", run_url, f"completed all its {done} steps: there is nothing to resume, and"
                            " it is left as it is",
                            "to train it longer, raise train.max_steps: "
                            f"{command_line.resume(run_url, f'train.max_steps={more}')} (continues from its final"
                            " checkpoint)")
        return
    source = str(conf.get("resume", "auto"))
    if newest_checkpoint(run_url) is None and source in NEW_RUN:
        first = rerun.first_invocation(manifest)
        again = (rerun.reproduce_command(first, "resume=restart", drop=("resume",)) if first is not None else None)
        raise PlanError("resume", run_url, f"holds no complete checkpoint ({manifest.get('status')} before its"
                        " first one): continuing it would silently start from step 0",
                        "start it again from step 0 in a new run directory: "
                        + (again or "its own command with resume=restart"))


def note_unfinished(root: str) -> str | None:
    """resume=auto: the console note naming the latest unfinished run under a local ``root`` (None: none)."""
    protocol = fsspec.core.split_protocol(root)[0]
    if protocol not in (None, "file", "local"):
        return None  # listing a bucket at every start is not free
    runs = unfinished_runs(root, limit=1)
    if not runs:
        return None
    run, state, ckpt = runs[0]
    return (f"ddp-run: note: {run} is {state} (checkpoint {ckpt}); this is a new run from step 0. To continue"
            " that one instead: ddp-run resume=last")
