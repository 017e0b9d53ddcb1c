"""ddp-compare's plots (issue 51, polish): a sweep at one world size draws no throughput-against-world-size plot
(there is no scaling to draw), one over world sizes does; the loss plots' legends name each run by what it differs
in (its swept values, run.json's invocation.swept), not by its folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.axes import Axes

from ddp_runner.contract import layout
from ddp_runner.report import compare
from ddp_runner.report.compare_plots import legend_labels


def _job(sweep: Path, num: int, swept: dict[str, str], world: int = 1) -> Path:
    """A sweep's job as the runner leaves it (global batch 16, four logged losses)."""
    run = sweep / (f"{num}_myreg_w{world}_" + "_".join(f"{k.split('.')[-1]}={v}" for k, v in swept.items()))
    run.mkdir(parents=True)
    plan = {"world_size": world, "per_rank_batch": 16 // world, "accumulation": 1, "global_batch": 16, "device": "cpu"}
    (run / layout.MANIFEST).write_text(json.dumps({"status": "completed", "task": "myreg", "plan": plan,
                                                   "invocation": {"swept": swept}}))
    (run / layout.SUMMARY).write_text(json.dumps({"status": "completed", "steps": 4, "losses": [3.0, 2.0, 1.9, 1.78],
                                                  "median": {"step_time_s": 0.01 / world ** 0.5}}))
    (run / layout.CONFIG).write_text(f"world_size: {world}\nseed: 7\ntrain:\n  lr: {swept.get('train.lr', 0.1)}\n"
                                     f"  log_every: 1\noutput:\n  root: {sweep}\n")
    return run


@pytest.fixture
def legend_spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The label of every line the plots draw."""
    seen: list[str] = []
    plot = Axes.plot

    def spy(self: Axes, *args: object, **kwargs: object) -> object:
        seen.append(str(kwargs.get("label")))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "plot", spy)
    return seen


def test_a_learning_rate_sweep_draws_no_throughput_plot_and_names_runs_by_lr(tmp_path: Path,
                                                                             legend_spy: list[str]) -> None:
    for num, lr in enumerate(("0.001", "0.01")):
        _job(tmp_path / "sweep", num, {"train.lr": lr})
    out = tmp_path / "report"
    assert compare.main([str(tmp_path / "sweep"), "--out", str(out)]) == 0
    assert not (out / "throughput.png").exists()
    assert (out / "loss_vs_step.png").read_bytes()[:4] == b"\x89PNG" and (out / "loss_vs_time.png").is_file()
    assert legend_spy == ["lr=0.001 (completed)", "lr=0.01 (completed)"] * 2  # step, then time


def test_a_world_size_sweep_draws_throughput_and_names_runs_by_world_size(tmp_path: Path,
                                                                          legend_spy: list[str]) -> None:
    for num, world in enumerate((1, 2)):
        _job(tmp_path / "sweep", num, {"world_size": str(world)}, world=world)
    out = tmp_path / "report"
    assert compare.main([str(tmp_path / "sweep"), "--out", str(out)]) == 0
    assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    assert legend_spy[:2] == ["ideal", "measured"]
    assert legend_spy[2:] == ["world_size=1 (completed)", "world_size=2 (completed)"] * 2


def test_legend_labels_fall_back_to_the_folder_where_they_would_not_tell_runs_apart(tmp_path: Path) -> None:
    runs = [compare.Run(path=tmp_path / n, name=n, status="completed", world=w, device="cpu", global_batch=16,
                        task="t", swept=s)
            for n, w, s in (("a", 1, {"world_size": "1", "train.lr": "0.1"}), ("b", 2, {"world_size": "2",
                                                                                         "train.lr": "0.1"}),
                            ("c", 1, {}), ("d", 1, {"train.lr": "0.5"}), ("e", 1, {"train.lr": "0.5"}))]
    assert legend_labels(runs) == ["world_size=1 lr=0.1", "world_size=2 lr=0.1", "c", "d", "e"]
