"""An early-stopping search (``hydra/sweeper=ddp_search``): Optuna asks the trials, every validation of a running
trial is reported to it as an intermediate value, and a trial its pruner stops saves a checkpoint and ends
``pruned``; its devices go to the next trial at once.

The pruning stays in the driver. Every trial is a job of the sweep's pool (:mod:`ddp_runner.job.pool`, one at a
time when ``sweep.parallel`` is off): its rank 0 writes its console as records, and the pool's poll hands them to
:meth:`Search.watch`, which reads the new ``val`` records, reports them (``trial.report``), asks the pruner
(``trial.should_prune``) and, on a prune, asks the pool to stop the job (:meth:`~ddp_runner.job.pool.Pool.prune`).
When a job ends, :meth:`Search.ended` tells the study its state: completed with its objective, pruned, failed, or
stopped (a Ctrl-C cut it short: told failed, marked to run again).

The study lives in the sweep directory (:data:`STUDY_FILE`, Optuna's journal file storage, safe across
processes), so a stopped search continues where it left off (``resume=<sweep dir>``, runner/job/search_sweeper.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddp_runner.report.sweep_search import trial_state

PRUNERS = ("median", "asha", "hyperband", "none")
STUDY_FILE = "study.journal"
STUDY_NAME = "ddp-search"
# A trial the search did not end (report/sweep_search.py: a stop cut it short, or it never started) says so in
# this attribute: a continued search does not count it, and asks it again.
STOPPED_ATTR = "ddp_stopped"
REQUEUED_ATTR = "ddp_requeued"  # the study's: numbers of the stopped trials already asked again

# The search the current ``ddp-run -m`` runs, set by the sweeper (runner/job/search_sweeper.py) and read by the
# sweep's jobs (runner/job/sweeping.py): Hydra hands its sweeper and its jobs nothing in common.
current: Search | None = None


def register() -> None:
    """``hydra/sweeper=ddp_search`` (hydra_plugins/ddp_runner_search): Hydra's plugin scan cannot list the modules
    of an editable install, so the sweeper is registered by hand too (a second registration changes nothing)."""
    from hydra.core.plugins import Plugins

    try:
        from hydra_plugins.ddp_runner_search.ddp_search_sweeper import DDPSearchSweeper
    except ImportError:  # not installed with the package: hydra/sweeper=ddp_search is then unknown, as Hydra says
        return
    Plugins.instance().register(DDPSearchSweeper)


def ended_before(study: Any) -> int:
    """The trials of ``study`` that ended (completed, pruned, failed): a continued search asks only the rest of
    its ``n_trials``. A trial stopped by Ctrl-C, or never started, does not count: it is asked again."""
    return sum(t.state.is_finished() and STOPPED_ATTR not in t.user_attrs for t in study.trials)


def requeue_stopped(study: Any) -> list[dict[str, Any]]:
    """A continued search runs again, first, the trials a stop cut short or never started (their values
    enqueued once: the study remembers which it requeued). Their values, in order."""
    done = set(study.user_attrs.get(REQUEUED_ATTR) or [])
    stopped = [t for t in study.trials if STOPPED_ATTR in t.user_attrs and t.number not in done]
    for t in stopped:
        study.enqueue_trial(dict(t.params), skip_if_exists=False)
    if stopped:
        study.set_user_attr(REQUEUED_ATTR, sorted(done | {t.number for t in stopped}))
    return [dict(t.params) for t in stopped]


def make_pruner(name: str, warmup_steps: int = 0, startup_trials: int = 2, min_steps: int | None = None,
                max_steps: int | None = None) -> Any:
    """Optuna's pruner for ``hydra.sweeper.pruner``: ``median`` (below the median of the trials before at the
    same step), ``asha`` (asynchronous successive halving: rungs at ``min_steps`` × 3^k), ``hyperband`` (several
    ASHA brackets), ``none``. ValueError for another name."""
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup_steps)
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=min_steps or "auto", reduction_factor=3)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=min_steps or 1, max_resource=max_steps or "auto",
                                              reduction_factor=3)
    if name in ("none", "", None):
        return optuna.pruners.NopPruner()
    raise ValueError(f"hydra.sweeper.pruner={name}: not one of {', '.join(PRUNERS)}")


def intermediate(record: Mapping[str, Any], key: str) -> float | None:
    """The objective ``key`` in one rank-0 ``val`` record (``{"step", "loss", "metrics"}``): ``val_loss`` is its
    loss, another key a validation metric of the task (``accuracy`` or ``val/accuracy``); None when it has none.
    A diverged loss (NaN, inf) is reported as it is: the pruners stop such a trial."""
    if record.get("kind") != "val":
        return None
    if key == "val_loss":
        found = record.get("loss")
    else:
        metrics = record.get("metrics") or {}
        found = metrics.get(key, metrics.get(f"val/{key.removeprefix('metrics.')}"))
    if isinstance(found, bool) or not isinstance(found, (int, float)):
        return None
    return float(found)


@dataclass
class Watched:
    """One running trial: its Optuna trial, how far its records were read, what it reported."""

    trial: Any
    offset: int = 0
    reported: dict[int, float] = field(default_factory=dict)
    total: int | None = None  # the optimizer steps the job plans (its progress records say)
    pruned_at: int | None = None


class Search:
    """The study of one search and the trials it is following, by job number."""

    def __init__(self, study: Any, pruner_name: str, objective: str) -> None:
        self.study, self.pruner_name, self.objective = study, pruner_name, objective
        self.trials: dict[int, Watched] = {}

    def add(self, num: int, trial: Any) -> None:
        """Follow job ``num``, Optuna's ``trial``."""
        self.trials[num] = Watched(trial)

    def watch(self, pool: Any) -> None:
        """The pool's poll: each running trial's new validations reported, and a trial the pruner stops stopped."""
        for num, child in list(pool.running.items()):
            w = self.trials.get(num)
            if w is None or w.pruned_at is not None:
                continue
            for rec in self._new_records(w, child.files["console"]):
                verdict = self.report(w, rec)
                if verdict is not None:
                    value = verdict["value"]
                    shown = f"{value:.6g}" if isinstance(value, float) else value
                    pool.view.say(f"ddp-run: sweep: job {num} pruned at step {verdict['step']} ({self.objective} "
                                  f"{shown}, pruner {self.pruner_name}): it saves a checkpoint and ends; its"
                                  " devices go to the next trial")
                    pool.prune(num, verdict)
                    break

    def report(self, w: Watched, rec: Mapping[str, Any]) -> dict[str, Any] | None:
        """Report one record of a trial; the prune record when the pruner stops it now, else None."""
        if isinstance(rec.get("total"), int):
            w.total = rec["total"]
        value, step = intermediate(rec, self.objective), rec.get("step")
        if value is None or not isinstance(step, int) or step in w.reported:
            return None
        w.reported[step] = value
        w.trial.report(value, step)
        # A diverged loss never recovers: pruned at once (unless the search prunes nothing: pruner none).
        diverged = not math.isfinite(value) and self.pruner_name != "none"
        if not diverged and not w.trial.should_prune():
            return None
        w.pruned_at = step
        return {"step": step, "value": value if math.isfinite(value) else str(value), "pruner": self.pruner_name}

    @staticmethod
    def _new_records(w: Watched, path: str) -> list[dict[str, Any]]:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                f.seek(w.offset)
                text = f.read()
        except OSError:
            return []
        complete, _, _ = text.rpartition("\n")  # a line still being written waits for the next poll
        w.offset += len(complete.encode()) + (1 if complete else 0)
        out = []
        for line in complete.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def ended(self, num: int, record: Mapping[str, Any]) -> None:
        """Tell the study how job ``num`` ended: its objective (completed), pruned, or failed."""
        import optuna

        w = self.trials.get(num)
        if w is None:
            return
        state = trial_state(record)
        value = record.get("objective")
        if state == "stopped":  # a continued search runs its trial again
            w.trial.set_user_attr(STOPPED_ATTR, str(record.get("status")))
        try:
            if state == "completed":
                self.study.tell(w.trial, float(value))
            elif state == "pruned":
                self.study.tell(w.trial, state=optuna.trial.TrialState.PRUNED)
            else:
                self.study.tell(w.trial, state=optuna.trial.TrialState.FAIL)
        except (RuntimeError, ValueError):  # told already (a record replaced): the first word stands
            pass

    def planned(self, num: int) -> int | None:
        """The optimizer steps job ``num`` planned, as its progress records said."""
        w = self.trials.get(num)
        return w.total if w is not None else None
