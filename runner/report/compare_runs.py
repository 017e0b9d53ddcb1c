"""What ``ddp-compare`` reads of a run directory (run.json, summary.json, config.yaml) as a :class:`Run`: its figures
by the rules every reader of a run shares (runner/rundir/figures.py), through the run tree's one reader
(runner/rundir/records.py), so that a damaged file is a refusal naming it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_runner.contract import layout
from ddp_runner.contract.run_files import RunManifest, RunSummary
from ddp_runner.rundir import figures, records
from ddp_runner.rundir.status import status_of


@dataclass
class Run:
    """What a comparison needs from one run directory."""

    path: Path
    name: str
    status: str
    world: int
    device: str
    global_batch: int | None
    task: str | None
    config: dict[str, Any] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    loss_steps: list[int] | None = None  # the step of each loss (summary.json's loss_steps; older runs: none)
    last_loss: float | None = None  # the last finite logged loss, else the final train/loss
    log_every: int = 1
    steps: int = 0
    step_time_s: float | None = None
    data_wait_s: float | None = None
    tokens_per_sample: int | None = None
    first_step_s: float | None = None
    val_loss: float | None = None
    goodput: dict[str, Any] | None = None
    gpus: dict[str, dict[str, float]] | None = None
    time_breakdown: dict[str, Any] | None = None
    failure: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the task's own: train/<name>, val/<name>
    swept: dict[str, str] = field(default_factory=dict)  # a sweep's job: its value of each swept key
    label: str | None = None  # what the report calls it (compare_table.labels); None: its directory's name

    def __post_init__(self) -> None:
        if self.last_loss is None and self.losses:  # a Run made by hand: its last logged loss
            self.last_loss = float(self.losses[-1])

    def _figures(self) -> figures.Figures:
        return figures.Figures(global_batch=self.global_batch, step_time_s=self.step_time_s,
                               tokens_per_sample=self.tokens_per_sample)

    @property
    def samples_per_s(self) -> float | None:
        """Global samples per second at the median step time (runner/rundir/figures.py)."""
        return self._figures().samples_per_s

    @property
    def rate(self) -> float | None:
        """Tokens/s for a task with tokens, else samples/s (runner/rundir/figures.py)."""
        return self._figures().rate

    @property
    def unit(self) -> str:
        """The unit of :attr:`rate`."""
        return self._figures().unit


def find_runs(paths: Sequence[str]) -> list[Path]:
    """Run directories among ``paths``: each one itself, or every run directory under a sweep directory."""
    found: list[Path] = []
    for p in map(Path, paths):
        if (p / layout.MANIFEST).is_file():
            found.append(p)
        elif p.is_dir():
            found += sorted(c.parent for c in p.rglob(layout.MANIFEST))
        else:
            raise FileNotFoundError(f"{p}: not a run directory or a folder holding some")
    return list(dict.fromkeys(found))


def load_run(path: Path) -> Run:
    """Read one run directory (a run that has no summary yet, or failed, is still a row)."""
    from fsspec.implementations.local import LocalFileSystem

    fs, run = LocalFileSystem(), str(path)
    manifest = records.read_manifest(fs, run)  # DamagedFile: the caller refuses with its one line
    summary = records.read_summary(fs, run) or {}
    config = records.read_config(fs, run, complete=False) if (path / layout.CONFIG).is_file() else {}
    try:
        return _run_of(path, manifest, summary, config)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a value of the wrong kind in a valid file
        raise records.DamagedFile(str(path / layout.SUMMARY), f"holds a value of the wrong kind ({type(exc).__name__}:"
                                  f" {str(exc)[:120]})", records.fix_for(layout.SUMMARY, run)) from None


def _run_of(path: Path, manifest: RunManifest, summary: RunSummary, config: dict[str, Any]) -> Run:
    plan = manifest["plan"]
    fig = figures.of_summary(summary, plan.get("global_batch"))
    final, mapping, number = figures.mapping(summary.get("final")), figures.mapping, figures.number
    cause = mapping(summary.get("root_cause"))
    who = f"rank {cause.get('rank')}" if cause.get("rank") is not None else cause.get("where") or "the launcher"
    failure = f"{who}: {cause.get('type')}: {str(cause.get('message'))[:120]}" if cause else None
    # run.json is the record of a run's status (a continued run's summary.json is the earlier attempt's)
    status = summary["status"] if summary.get("status") and not manifest.get("status") else status_of(manifest)
    return Run(
        path=path, name=path.name, status=status,
        world=int(plan.get("world_size") or 0), device=str(plan.get("device", "cpu")),
        global_batch=fig.global_batch, task=manifest.get("task"), config=config,
        losses=fig.losses, loss_steps=fig.loss_steps, last_loss=fig.last_loss,
        log_every=int((config.get("train") or {}).get("log_every") or 1), steps=fig.steps or 0,
        step_time_s=fig.step_time_s, data_wait_s=number(final.get("perf/data_wait_s")),
        tokens_per_sample=fig.tokens_per_sample,
        first_step_s=_first_step_seconds(summary), val_loss=number(summary.get("val_loss")),
        goodput=mapping(summary.get("goodput")) or None, gpus=mapping(summary.get("gpus")) or None,
        time_breakdown=mapping(summary.get("time_breakdown")) or None,
        failure=failure,
        metrics={k: v for k, v in mapping(summary.get("metrics")).items() if isinstance(v, (int, float))},
        swept={str(k): str(v) for k, v in mapping(mapping(manifest.get("invocation")).get("swept")).items()},
    )


def _first_step_seconds(summary: Mapping[str, Any]) -> float | None:
    """Seconds to the end of the first step (start-up and compilation included, where goodput timed them)."""
    g = summary.get("goodput") or {}
    seconds = g.get("seconds") or {}
    if "first_step" in seconds:
        return float(seconds["first_step"]) + float(seconds.get("startup", 0.0))
    return summary.get("time_to_first_step_s")
