"""The shapes of a run directory's two JSON records, run.json (the manifest) and summary.json, as their writers
write them today: the driver writes run.json (runner/rundir/manifest.py, then the launchers and finalisation
update it) and summary.json (finalisation, around the training summary that rank 0's engine hands over through its
facts, tasks/engine/trainer.py). Readers (runner/rundir/records.py and everything that reads a run) go by these
names.

Typing only: nothing here checks a file (a file on disk may be older, hand-edited or cut short: the readers judge
it, runner/rundir/records.py). ``total=False`` where a key is absent in some runs (written by one launcher only, or
only once the run has ended). Standard library only: the workers import it too. No postponed annotations here:
TypedDict reads ``NotRequired`` from evaluated ones.
"""

from typing import Any, NotRequired, TypedDict

from ddp_runner.contract.stops import StopRecord


class PlanRecord(TypedDict):
    """run.json's ``plan`` (runner/config/plan.py, ``Plan.to_manifest``)."""

    world_size: int
    per_rank_batch: int
    accumulation: int
    global_batch: int
    device: str
    backend: str
    nnodes: int
    nproc_per_node: int
    gpus: list[dict[str, Any]]  # {physical_index, name, uuid} per visible device
    explanation: str
    # batch.per_rank=auto: {mode, per_rank_share, start, why}; None when the micro-batch was given
    micro_batch: NotRequired[dict[str, Any] | None]


class DriverRecord(TypedDict):
    """run.json's ``driver``: who writes the run directory, and that it is alive (runner/rundir/status.py)."""

    host: str
    pid: int
    started: float  # the process's start, Unix seconds
    heartbeat: float  # Unix seconds, refreshed while the run runs


class Invocation(TypedDict, total=False):
    """run.json's ``invocation``: how the run was asked for (runner/job/execute.py, ``Invocation.record``)."""

    argv: list[str]
    cwd: str
    overrides: list[str]
    task_preset: str | None
    paths_given: Any
    config_name: str | None
    config_sources: Any
    task_dir: str | None
    swept: dict[str, Any]  # a sweep's job: its value of each swept key
    sweep: dict[str, Any] | None  # a sweep's job: the sweep and the job's number


# run.json's ``finalize_error``: the driver failed while finalising (runner/launch/finalize.py); ``while`` is what it
# was doing (a Python keyword: hence the functional form).
FinalizeError = TypedDict("FinalizeError", {"while": str, "error": str, "interrupted_by": int | None})


class RunManifest(TypedDict):
    """run.json. Written before launch with status ``running`` (runner/rundir/manifest.py, ``initial_manifest``),
    refreshed by the heartbeat, and rewritten when the run ends; the keys marked NotRequired appear only in some
    runs (a continued one, a Slurm or multi-node one, one that has ended)."""

    status: str  # layout.STATUS_*
    task: str
    invocation: Invocation
    data: dict[str, Any] | None  # the data's source, size and hash
    plan: PlanRecord
    command: list[str]
    versions: dict[str, str | None]  # ddp_runner, python, torch, hydra, nccl (and cuda once ended)
    host: str
    driver: DriverRecord
    devices: list[dict[str, Any]]  # local rank -> physical device (or "cpu")
    git: dict[str, Any] | None  # {commit, dirty}; None outside the project's checkout
    started: str  # ISO local time of the first launch, kept across continuations
    ended: str | None
    exit_codes: dict[str, Any]
    restarts: int
    doctor: NotRequired[dict[str, Any]]  # the preflight checks' report
    memory_plan: NotRequired[dict[str, Any] | None]  # layout.MANIFEST_MEMORY_PLAN
    trackers: NotRequired[dict[str, Any]]  # tracking.MANIFEST_TRACKERS
    resume_changes: NotRequired[dict[str, Any]]
    continued: NotRequired[list[str]]  # ISO times of each continuation in place
    first_invocation: NotRequired[Invocation]  # a continued run's: the command that started it (reproduce)
    torchrun_exit_code: NotRequired[int]
    ranks: NotRequired[dict[str, dict[str, Any]]]  # per rank: host, node, device, device_name, … pid
    stop_after_the_end: NotRequired[str]
    finalize_error: NotRequired[FinalizeError]
    nodes: NotRequired[dict[str, Any]]  # a multi-node run: each node's record
    slurm: NotRequired[dict[str, Any]]
    slurm_state: NotRequired[str]


class Completion(TypedDict):
    """summary.json's ``completion``: did every rank report completion on a distinct device."""

    completed_ranks: list[int]
    devices: dict[str, str]
    all_completed: bool
    distinct_devices: bool


class TrainSummary(TypedDict, total=False):
    """What rank 0's engine hands over as its facts' ``summary`` (tasks/engine/trainer.py, ``_finish`` and
    ``_series``), copied into summary.json; absent when the run failed before its end."""

    steps: int
    epochs_started: int
    final: dict[str, float]  # the last logged scalars: train/loss, perf/step_time_s, perf/data_wait_s, …
    val_loss: float | None
    metrics: dict[str, float]  # the task's own: train/<name>, val/<name>
    median: dict[str, float | None]  # step_time_s, tokens_per_s, … over the logging windows but the first
    perf_windows: dict[str, Any]
    perf_span_unix: Any
    losses: list[float | None]  # downsampled (runner/contract/series.py)
    loss_steps: list[int]
    losses_logged: int
    gpus: dict[str, dict[str, float]]  # per rank: medians of its GPU's telemetry
    time_to_first_step_s: float | None
    goodput: dict[str, Any]
    time_breakdown: dict[str, Any]
    scaling_facts: dict[str, Any]  # scaling.SUMMARY_KEY
    compile: dict[str, Any]
    validation: dict[str, Any] | None
    resumed_from: str | None
    stopped: StopRecord | None
    stop_vote: dict[str, Any] | None
    micro_batch: dict[str, Any] | None  # batch.per_rank=auto: the fitted micro-batch (tasks/engine/micro_fit.py)
    trackers: dict[str, Any]


class RunSummary(TrainSummary, total=False):
    """summary.json, written by the driver when the run ends (runner/launch/finalize.py): the status, the plan in
    words, the completion check and the root cause, around the engine's :class:`TrainSummary`."""

    status: str
    explanation: str
    global_batch: int
    completion: Completion
    root_cause: dict[str, Any] | None  # runner/diagnostics/rootcause.py; None when the run completed or was stopped
