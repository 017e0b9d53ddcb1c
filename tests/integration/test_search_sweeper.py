"""The search sweeper's loop in process (runner/job/search_sweeper.py), its jobs run by a fake launcher: it asks
``n_trials`` trials, launches each with its sampled values, tells the study how each ended, leaves the best
trial in Hydra's folder and its study in the sweep directory, and a continued search asks only the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

optuna = pytest.importorskip("optuna")

from ddp_runner.job import search, search_sweeper, sweeping  # noqa: E402
from ddp_runner.report.sweep import SweepRecord  # noqa: E402


class Launcher:
    """Hydra's launcher as the sweeper sees it: each job 'runs' at once; lr 3 is pruned, lr ``interrupt`` is cut
    short by a Ctrl-C, the others complete with their lr as objective."""

    def __init__(self, record: SweepRecord, interrupt: float | None = None) -> None:
        self.record, self.batches, self.interrupt = record, [], interrupt

    def launch(self, batch: list[list[str]], initial_job_idx: int) -> list[Any]:
        [overrides] = batch
        self.batches.append((initial_job_idx, overrides))
        assert search.current is not None and sweeping.concurrent({"launcher": {"name": "local"}})
        lr = float(overrides[-1].split("=", 1)[1])
        rec = {"job": initial_job_idx, "values": {"train.lr": str(lr)}, "overrides": overrides, "exit_code": 0,
               "status": "pruned" if lr == 3 else "interrupted" if lr == self.interrupt else "completed",
               "objective": None if lr in (3, self.interrupt) else lr,
               "run_dir": f"run{initial_job_idx}", "figures": {"steps": 4 if lr == 3 else 10}}
        self.record.jobs.append(rec)
        search.current.ended(initial_job_idx, rec)
        return []


def _sweeper(tmp_path: Path, n_trials: int, resume: str | None = None, interrupt: float | None = None,
             ) -> tuple[Any, SweepRecord]:
    hydra_dir = tmp_path / "hydra"
    hydra_dir.mkdir(exist_ok=True)
    record = SweepRecord(["ddp-run", "-m"], ["train.lr"], str(hydra_dir))
    sweeping.Sweep(record, [])
    cfg = OmegaConf.create({"output": {"root": str(tmp_path / "out")}, "dry_run": False,
                            "sweep": {"objective": "val_loss", "direction": "minimize"},
                            "hydra": {"sweep": {"dir": str(hydra_dir)}}})
    sweeper = type("Sweeper", (), dict(config=cfg, launcher=Launcher(record, interrupt), n_trials=n_trials,
                                       pruner="median", startup_trials=1, warmup_steps=0, min_steps=None,
                                       sampler="grid", seed=0, params=None, resume=resume))()
    return sweeper, record


def test_a_search_asks_its_trials_tells_each_and_continues(tmp_path: Path) -> None:
    sweeper, record = _sweeper(tmp_path, 3, interrupt=None)
    search_sweeper.run(sweeper, ["task=gpt", "train.lr=choice(1,2,3,4)"])
    assert search.current is None  # the search is over: later jobs are plain ones
    assert [n for n, _ in sweeper.launcher.batches] == [0, 1, 2]
    assert all(o[0] == "task=gpt" and o[1].startswith("train.lr=") for _, o in sweeper.launcher.batches)
    sweep_dir = Path(record.sweep_dir)
    assert (sweep_dir / search.STUDY_FILE).is_file()
    record.write()
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    done = [j for j in record.jobs if j["status"] == "completed"]
    assert best["best_value"] == min(j["objective"] for j in done)

    again, record2 = _sweeper(tmp_path, 4, resume=str(sweep_dir))
    search_sweeper.run(again, ["task=gpt", "train.lr=choice(1,2,3,4)"])
    assert [n for n, _ in again.launcher.batches] == [3]  # one trial left, numbered after the others
    assert record2.sweep_dir == str(sweep_dir) and len(record2.jobs) == 4
    study = search_sweeper.open_study(str(sweep_dir), "minimize", search.make_pruner("none"), None, True)
    states = sorted(t.state.name for t in study.trials)
    assert len(states) == 4 and set(states) <= {"COMPLETE", "PRUNED"}
    launched = {o[1] for _, o in sweeper.launcher.batches + again.launcher.batches}
    assert len(launched) == 4  # the grid asked each value once, across the stop


def test_a_continued_search_runs_the_trial_a_stop_cut_short_again_first(tmp_path: Path) -> None:
    first, record = _sweeper(tmp_path, 2, interrupt=2.0)
    search_sweeper.run(first, ["train.lr=choice(1,2,4)"])
    record.write()
    asked = [o[-1] for _, o in first.launcher.batches]
    assert "train.lr=2" in asked and len(asked) == 2  # the grid's order (seed 0) asks 2 among the first two
    again, _ = _sweeper(tmp_path, 3, resume=record.sweep_dir)
    search_sweeper.run(again, ["train.lr=choice(1,2,4)"])
    relaunched = [o[-1] for _, o in again.launcher.batches]
    # the interrupted trial again (first), then the grid's last value: 3 trials ended in all
    assert relaunched[0] == "train.lr=2" and len(relaunched) == 2 and set(asked + relaunched) == {
        "train.lr=1", "train.lr=2", "train.lr=4"}


def test_a_bad_pruner_or_grid_is_refused_before_any_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for setting, line in ((dict(pruner="bogus"), "refused: hydra.sweeper.pruner='bogus': not one of median"),
                          (dict(sampler="grid"), "refused: hydra.sweeper.sampler='grid': every swept key")):
        sweeper, _ = _sweeper(tmp_path, 2)
        for k, v in setting.items():
            setattr(sweeper, k, v)
        with pytest.raises(SystemExit) as stop:
            search_sweeper.run(sweeper, ["train.lr=interval(0.001,0.1)"])
        assert stop.value.code == 2 and sweeper.launcher.batches == []
        assert line in capsys.readouterr().err
