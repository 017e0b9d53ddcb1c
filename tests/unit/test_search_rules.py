"""The early-stopping search's pure parts and its pruning loop against a fake pool (runner/job/search.py,
runner/job/search_sweeper.py, runner/report/sweep_search.py): pruner choice, the search space, what a validation
record reports, trial states and the optimizer steps the pruning saved."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

optuna = pytest.importorskip("optuna")

from ddp_runner.job import search, search_sweeper  # noqa: E402
from ddp_runner.report import sweep_search  # noqa: E402


@pytest.mark.parametrize(("name", "cls"), [("median", "MedianPruner"), ("asha", "SuccessiveHalvingPruner"),
                                           ("hyperband", "HyperbandPruner"), ("none", "NopPruner")])
def test_each_pruner_name_is_optunas_pruner(name: str, cls: str) -> None:
    assert type(search.make_pruner(name)).__name__ == cls


def test_an_unknown_pruner_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="median, asha, hyperband, none"):
        search.make_pruner("sometimes")


def test_the_search_space_is_the_command_lines_sweeps_and_params() -> None:
    dists, fixed = search_sweeper.space(["task=gpt", "train.lr=tag(log,interval(0.0001,1))", "seed=choice(1,2)"],
                                        {"train.warmup_steps": "tag(int,interval(0,10))"})
    assert fixed == ["task=gpt"]
    lr = dists["train.lr"]
    assert isinstance(lr, optuna.distributions.FloatDistribution) and lr.log and (lr.low, lr.high) == (1e-4, 1.0)
    assert dists["seed"].choices == (1, 2)
    assert isinstance(dists["train.warmup_steps"], optuna.distributions.IntDistribution)
    assert search_sweeper.trial_overrides({"train.lr": 0.001, "seed": 2}, fixed) == ["task=gpt", "train.lr=0.001",
                                                                                     "seed=2"]


def test_a_validation_record_reports_its_loss_or_the_named_metric() -> None:
    rec = {"kind": "val", "step": 5, "loss": 2.5, "metrics": {"val/accuracy": 0.75}}
    assert search.intermediate(rec, "val_loss") == 2.5
    assert search.intermediate(rec, "accuracy") == 0.75
    assert search.intermediate(rec, "tokens_per_s") is None
    assert search.intermediate({"kind": "step", "step": 5, "loss": 2.0}, "val_loss") is None
    assert math.isnan(search.intermediate({"kind": "val", "step": 5, "loss": float("nan")}, "val_loss"))


def test_trial_states_and_the_pruned_step() -> None:
    assert sweep_search.trial_state({"status": "completed", "objective": 1.0}) == "completed"
    assert sweep_search.trial_state({"status": "completed", "objective": None}) == "failed"  # diverged
    assert sweep_search.trial_state({"status": "pruned"}) == "pruned"
    assert sweep_search.trial_state({"status": "refused"}) == "failed"
    assert sweep_search.trial_state({"status": "interrupted"}) == "stopped"  # a continued search runs it again
    assert sweep_search.trial_state({"status": "not run"}) == "stopped"
    assert sweep_search.state_text({"status": "pruned", "pruned": {"step": 10}}) == "pruned at step 10"
    assert sweep_search.state_text({"status": "completed"}) == "completed"


def _job(status: str, steps: int | None, planned: int | None = 40, run_dir: str | None = "r") -> dict[str, Any]:
    return {"status": status, "figures": {"steps": steps}, "planned_steps": planned, "run_dir": run_dir,
            "objective": 1.0 if status == "completed" else None}


def test_steps_saved_count_every_started_trial_at_its_full_length() -> None:
    jobs = [_job("completed", 40), _job("pruned", 9), _job("pruned", 7), _job("not run", None, None, None),
            _job("interrupted", 12), _job("failed", 3)]
    # a pruned trial counts at its full length unpruned, a failed one as it ran, a stopped one not at all
    assert sweep_search.steps_saved(jobs) == {"ran": 59, "unpruned": 123, "saved": 64,
                                              "saved_fraction": round(64 / 123, 4)}
    # no plan recorded: the longest completed trial is the full length
    assert sweep_search.steps_saved([_job("completed", 30, None), _job("pruned", 5, None)])["unpruned"] == 60
    # a pruned trial that planned more (a continued search given other steps) saved what it planned
    assert sweep_search.steps_saved([_job("completed", 30, 30), _job("pruned", 5, 100)])["saved"] == 95
    found = sweep_search.summary(jobs, {"pruner": "median"})
    assert found["trials"] == {"completed": 1, "pruned": 2, "stopped": 2, "failed": 1}
    assert sweep_search.markdown_lines(found)[1].startswith("Optimizer steps: 59 run of 123")


class FakePool:
    """The pool as the search sees it: running children whose rank 0 writes console records."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.running, self.pruned, self.said = tmp, {}, [], []
        self.view = SimpleNamespace(say=self.said.append)

    def child(self, num: int) -> Path:
        path = self.tmp / f"job-{num}.console"
        path.write_text("")
        self.running[num] = SimpleNamespace(files={"console": str(path)})
        return path

    def prune(self, num: int, record: dict[str, Any]) -> None:
        self.pruned.append((num, record))


def _val(path: Path, step: int, loss: float, total: int = 40) -> None:
    with path.open("a") as f:
        f.write(json.dumps({"kind": "step", "step": step, "total": total, "loss": loss}) + "\n")
        f.write(json.dumps({"kind": "val", "step": step, "loss": loss, "metrics": {}}) + "\n")


def test_a_trial_worse_than_the_median_is_pruned_at_its_validation_and_told_pruned(tmp_path: Path) -> None:
    study = optuna.create_study(direction="minimize", pruner=search.make_pruner("median", startup_trials=1))
    found, pool = search.Search(study, "median", "val_loss"), FakePool(tmp_path)
    good = pool.child(0)
    found.add(0, study.ask())
    for step, loss in ((5, 2.0), (10, 1.5)):
        _val(good, step, loss)
        found.watch(pool)
    assert pool.pruned == [] and found.planned(0) == 40
    del pool.running[0]
    found.ended(0, {"status": "completed", "objective": 1.5})
    bad = pool.child(1)
    found.add(1, study.ask())
    _val(bad, 5, 9.0)
    with bad.open("a") as f:
        f.write('{"kind": "val", "step": 10, "lo')  # a line still being written is read at the next poll
    found.watch(pool)
    assert pool.pruned == [(1, {"step": 5, "value": 9.0, "pruner": "median"})]
    assert "job 1 pruned at step 5" in pool.said[0]
    found.watch(pool)  # asked once
    assert len(pool.pruned) == 1
    found.ended(1, {"status": "pruned"})
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED]
    assert study.trials[1].intermediate_values == {5: 9.0}


def test_a_diverged_loss_is_pruned_and_a_failed_job_is_a_failed_trial(tmp_path: Path) -> None:
    study = optuna.create_study(pruner=search.make_pruner("median", startup_trials=0))
    found, pool = search.Search(study, "median", "val_loss"), FakePool(tmp_path)
    found.add(0, study.ask())
    _val(pool.child(0), 5, float("nan"))
    found.watch(pool)
    assert pool.pruned and pool.pruned[0][1]["value"] == "nan"
    found.add(1, study.ask())
    found.ended(1, {"status": "failed"})
    unpruned = search.Search(optuna.create_study(pruner=search.make_pruner("none")), "none", "val_loss")
    unpruned.add(2, unpruned.study.ask())
    _val(pool.child(2), 5, float("nan"))
    unpruned.watch(pool)
    assert len(pool.pruned) == 1  # pruner none: every trial runs to its end, a diverged one too
    assert study.trials[1].state == optuna.trial.TrialState.FAIL


def test_the_study_is_a_journal_file_in_the_sweep_folder_and_continues(tmp_path: Path) -> None:
    sampler = search_sweeper.make_sampler("random", 0, {})
    first = search_sweeper.open_study(str(tmp_path), "minimize", search.make_pruner("none"), sampler, resume=False)
    first.tell(first.ask(), 1.0)
    again = search_sweeper.open_study(str(tmp_path), "minimize", search.make_pruner("none"), sampler, resume=True)
    assert (tmp_path / search.STUDY_FILE).is_file() and len(again.trials) == 1


def test_a_grid_asks_every_combination_once() -> None:
    dists, _ = search_sweeper.space(["train.lr=choice(0.01,0.05,-1)"], None)
    study = optuna.create_study(sampler=search_sweeper.make_sampler("grid", 2, dists))
    seen = []
    for _ in range(3):
        trial = study.ask(dists)
        seen.append(trial.params["train.lr"])
        study.tell(trial, 1.0)
    assert sorted(seen) == [-1, 0.01, 0.05]
    with pytest.raises(ValueError, match="choice"):
        search_sweeper.make_sampler("grid", 0, search_sweeper.space(["train.lr=interval(0,1)"], None)[0])


def test_resume_names_the_sweep_whose_study_continues(tmp_path: Path) -> None:
    (tmp_path / search.STUDY_FILE).write_text("")
    fixed = ["task=gpt", f"resume={tmp_path}"]
    assert search_sweeper.continued(fixed, None) == (str(tmp_path), ["task=gpt"])
    assert search_sweeper.continued(["resume=auto"], None) == (None, ["resume=auto"])  # a job's own resume
    assert search_sweeper.continued(["task=gpt"], "/x/sweep/") == ("/x/sweep", ["task=gpt"])


def test_a_continued_search_counts_the_trials_that_ended_not_those_stopped(tmp_path: Path) -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    found, dists = search.Search(study, "none", "val_loss"), {"lr": optuna.distributions.FloatDistribution(0, 1)}
    for num, rec in enumerate([{"status": "completed", "objective": 1.0}, {"status": "pruned"},
                               {"status": "failed"}, {"status": "interrupted"}, {"status": "not run"}]):
        found.add(num, study.ask(dists))
        found.ended(num, rec)
    study.ask(dists)  # asked, never told (the driver was killed)
    assert search.ended_before(study) == 3
    assert [t.user_attrs.get(search.STOPPED_ATTR) for t in study.trials[3:5]] == ["interrupted", "not run"]
    params = [dict(study.trials[n].params) for n in (3, 4)]
    assert search.requeue_stopped(study) == params  # asked again first, with their own values
    assert search.requeue_stopped(study) == []  # once
    assert search.ended_before(study) == 3  # the requeued trials wait: not ended
    assert [study.ask(dists).params for _ in range(2)] == params and params[0] != params[1]


def test_ddp_compares_trials_say_where_a_trial_was_pruned_and_the_steps_saved() -> None:
    from ddp_runner.report.sweep import trials_markdown

    jobs = [{**_job("completed", 40), "job": 0, "values": {"train.lr": "0.003"}},
            {**_job("pruned", 9), "job": 1, "values": {"train.lr": "1000.0"}, "pruned": {"step": 5}}]
    record = {"objective": {"key": "val_loss", "direction": "minimize"}, "jobs": jobs,
              "search": sweep_search.summary(jobs, {"pruner": "median"})}
    text = trials_markdown(record)
    assert "| 1 | train.lr=1000.0 | pruned at step 5 | — (pruned) |" in text
    assert "Best: job 0 (train.lr=0.003)" in text
    assert "Optimizer steps: 49 run of 80 had every trial run to its end (saved 31, 39%)." in text


def test_a_stop_the_pruner_asked_for_ends_pruned_and_only_then(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               ) -> None:
    from ddp_runner.contract import layout
    from ddp_runner.supervise import finalize

    stopped = {"step": 9, "signal": 15, "checkpoint": "step_9"}
    request = tmp_path / "job-1.prune"
    monkeypatch.setenv(layout.ENV_PRUNE_REQUEST, str(request))
    manifest: dict[str, Any] = {"pruned": {"step": 1}}  # an earlier attempt's
    assert finalize._status(manifest, False, 15, None, stopped) == "interrupted" and "pruned" not in manifest
    request.write_text(json.dumps({"step": 5, "value": "nan", "pruner": "median"}))
    assert finalize._status(manifest, False, 15, None, stopped) == "pruned"
    assert manifest["pruned"] == {"step": 5, "value": "nan", "pruner": "median"}
    assert finalize._status(manifest, True, None, None, None) == "completed"  # the stop came after the end
    assert finalize._status({}, False, None, None, None) == "failed"  # a failure is no prune


def test_a_pruned_job_closes_its_mlflow_run_killed_and_leaves_its_sweep_well(monkeypatch: pytest.MonkeyPatch,
                                                                            ) -> None:
    from ddp_runner.contract import tracking
    from ddp_runner.trackers import runs

    calls: list[tuple[str, str]] = []

    class Store:
        def run(self, run_id: str) -> tuple[str, dict[str, str]]:
            return "RUNNING", {}

        def set_status(self, run_id: str, status: str, *, end: bool) -> None:
            calls.append((run_id, status))

    monkeypatch.setattr(runs.mlflow_rest, "client", lambda uri, timeout: Store())
    conf = {"logger": {"mlflow": {"tracking_uri": "http://127.0.0.1:1"}}}
    record = {tracking.MLFLOW: {"run_id": "r", "parent_run_id": "p", "tracking_uri": "http://127.0.0.1:1"}}
    assert runs.finish(conf, record, "pruned") is None
    assert calls == [("r", "KILLED"), ("p", "FINISHED")]
    calls.clear()
    runs.finish(conf, record, "interrupted")
    assert calls == [("r", "KILLED"), ("p", "FAILED")]


@pytest.mark.parametrize("name", ["median", "asha", "hyperband", "none"])
def test_each_pruner_stops_worse_trials_asked_and_told_one_by_one(name: str) -> None:
    """The search asks and tells (no ``study.optimize``): every pruner works so, and prunes trials that are worse
    at every step than those before them (``none``: never)."""
    study = optuna.create_study(pruner=search.make_pruner(name, startup_trials=1, min_steps=10))
    pruned = []
    for k in range(6):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        at = None
        for step in range(10, 101, 10):
            trial.report(k + 1 / step, step)
            if trial.should_prune():
                at = step
                break
        study.tell(trial, state=optuna.trial.TrialState.PRUNED) if at else study.tell(trial, k + 0.01)
        pruned.append(at)
    assert pruned[0] is None  # the first trial always runs to its end
    assert (any(pruned) if name != "none" else not any(pruned)), pruned
