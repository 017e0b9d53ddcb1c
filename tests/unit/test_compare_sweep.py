"""ddp-compare on a sweep that is no scaling study (issue 43): a learning-rate sweep at one rank has no scaling
columns, its swept key is the comparison (not a warning), its runs are labelled by the values they swept, and every
column of the table is named in the legend under it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ddp_runner.contract import layout
from ddp_runner.report import compare


def _job(sweep: Path, num: int, lr: str, world: int = 1, step_time_s: float = 0.01, seed: int = 7,
         sweeps_world: bool = False) -> Path:
    """A job of ``ddp-run -m task.module=myreg train.lr=…`` as the runner leaves it."""
    run = sweep / f"{num}_myreg_w{world}_lr={lr}"
    run.mkdir(parents=True)
    plan = {"world_size": world, "per_rank_batch": 16 // world, "accumulation": 1, "global_batch": 16, "device": "cpu"}
    swept = {"world_size": str(world), "train.lr": lr} if sweeps_world else {"train.lr": lr}
    (run / layout.MANIFEST).write_text(json.dumps({"status": "completed", "task": "myreg", "plan": plan,
                                                   "invocation": {"swept": swept}}))
    (run / layout.SUMMARY).write_text(json.dumps({"status": "completed", "steps": 4, "losses": [3.0, 2.0, 1.9, 1.78],
                                                  "median": {"step_time_s": step_time_s}}))
    (run / layout.CONFIG).write_text(f"world_size: {world}\nseed: {seed}\ntrain:\n  lr: {lr}\n  log_every: 1\n"
                                     f"output:\n  root: {sweep}\n")
    return run


def _legend_names(report: str) -> set[str]:
    return set(re.findall(r"^- \*\*(.+?)\*\*: ", report.split("Columns:")[1], re.M))


def _headers(report: str) -> list[str]:
    return [h.strip() for line in report.splitlines() if line.startswith("| run |") for h in line.strip("|").split("|")]


def test_a_learning_rate_sweep_at_one_rank(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    for num, (lr, step) in enumerate((("0.001", 0.010), ("0.01", 0.0093), ("0.1", 0.0053))):
        _job(sweep, num, lr, step_time_s=step)
    out = tmp_path / "report"
    assert compare.main([str(sweep), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    table = report.split("Columns:")[0]
    assert "scaling" not in report.split("## Where the time goes")[0]  # every run has one rank: nothing scales
    assert "scaling efficiency" not in report
    assert "other settings differ" not in report and "Warning" not in report  # the swept key is the comparison
    assert "Swept (what the runs differ in on purpose): train.lr = 0.001, 0.01, 0.1." in report
    assert [line.split(" | ")[0].lstrip("| ") for line in table.splitlines() if line.startswith("| lr=")] == [
        "lr=0.001", "lr=0.01", "lr=0.1"]
    assert "=0.001=" not in report
    assert "- lr=0.01 (1 rank): " in report
    assert _legend_names(report) == set(_headers(report)), "every column is named in the legend"
    # the median of each run's four logged losses (3.0, 2.0, 1.9, 1.78): fewer than the smoothing window
    assert ("- **time to loss 1.95**: training time until the smoothed training loss (the median of the last 5 logged"
            " losses, so that one lucky batch does not count) first reached it") in report
    rows = {r["run"]: r for r in compare.rows([compare.load_run(p) for p in compare.find_runs([str(sweep)])], None,
                                              1.0)}
    assert rows["1_myreg_w1_lr=0.01"]["label"] == "lr=0.01" and rows["1_myreg_w1_lr=0.01"]["efficiency"] is None


def test_a_setting_the_sweep_did_not_vary_is_still_a_warning(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    _job(sweep, 0, "0.001")
    _job(sweep, 1, "0.01", seed=8)
    warns = compare.warnings([compare.load_run(p) for p in compare.find_runs([str(sweep)])])
    assert warns == ["other settings differ: seed (lr=0.001: 7, lr=0.01: 8)"]


def test_scaling_columns_and_their_legend_where_the_world_size_varies(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    # lr=0.1's jobs are twice as slow (another model, say): each learning rate scales 80% from 1 to 2 ranks
    for num, (world, lr, step) in enumerate(((1, "0.01", 0.01), (2, "0.01", 0.00625), (1, "0.1", 0.02),
                                             (2, "0.1", 0.0125))):
        _job(sweep, num, lr, world=world, step_time_s=step, sweeps_world=True)
    out = tmp_path / "report"
    assert compare.main([str(sweep), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "scaling eff." in _headers(report) and _legend_names(report) == set(_headers(report))
    # two runs per learning rate: the ranks set them apart; each learning rate's 1-rank run is its own baseline
    cells = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[5] for line in report.splitlines()
             if line.startswith("| lr=")}
    assert cells == {"lr=0.01 w1": "100.0%", "lr=0.01 w2": "80.0%", "lr=0.1 w1": "100.0%", "lr=0.1 w2": "80.0%"}
    assert "Swept (what the runs differ in on purpose): world_size = 1, 2; train.lr = 0.01, 0.1." in report


def test_labels_fall_back_to_the_directory_name() -> None:
    def run(name: str, swept: dict[str, str], world: int = 1) -> compare.Run:
        return compare.Run(path=Path(name), name=name, status="completed", world=world, device="cpu", global_batch=8,
                           task="t", swept=swept)

    assert compare.labels([run("a", {"train.lr": "0.1"}), run("b", {}), run("c", {"world_size": "2"}, 2)]) == [
        "lr=0.1", "b", "c"]
    # the same values in two sweeps at the same world size: their directories tell them apart
    assert compare.labels([run("s1/0_x_w1_lr=0.1", {"train.lr": "0.1"}),
                           run("s2/0_x_w1_lr=0.1", {"train.lr": "0.1"})]) == ["s1/0_x_w1_lr=0.1", "s2/0_x_w1_lr=0.1"]
