"""``batch.per_rank=auto`` across a resume, in process (the real Trainer on a one-process gloo group): a checkpoint
records the micro-batch the fitting settled on and how it got there; a resumed launch on a device with room for
more keeps that size (no re-fitting, the same steps as the uninterrupted run) and keeps the earlier launch's
out-of-memory history in its record."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from ddp_runner.tasks.engine import checkpoint as ck
from ddp_runner.tasks.engine.config import Config
from ddp_runner.tasks.engine.diagnostics import faults
from ddp_runner.tasks.engine.rank import Context
from ddp_runner.tasks.engine.trackers.base import Trackers
from ddp_runner.tasks.engine.trackers.tensorboard import TensorBoard
from ddp_runner.tasks.engine.trainer import Trainer

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
# The smoke task, one rank, a global batch of 16: the fitting starts at the whole share of 16.
AUTO = ["task=smoke", "batch.per_rank=auto", "batch.global=16", "checkpoint.async_save=false", "train.num_workers=0",
        "resume=auto"]
HALVINGS = [{"micro_batch": 16, "step": 1}, {"micro_batch": 8, "step": 1}]  # above 4 runs out: 16, 8, then 4 fits


def _config(*overrides: str) -> Config:
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["device=cpu", "backend=gloo", *overrides])
    return Config(OmegaConf.to_container(cfg, resolve=True))


@pytest.fixture
def gloo_group(tmp_path: Path) -> Iterator[None]:
    """A one-process gloo group in this process (the Trainer's DDP set-up needs a default group)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield
    finally:
        faults.use(faults.Faults())
        dist.destroy_process_group()


def _launch(run_dir: Path, steps: int, oom_above: int | None) -> tuple[Trainer, dict[str, Any]]:
    """One launch into ``run_dir`` to ``steps`` optimizer steps (continuing its checkpoint, if any), on a device
    where a micro-batch above ``oom_above`` samples runs out of memory (None: any fits)."""
    faults.use(faults.Faults(oom_above=(oom_above, None)) if oom_above is not None else faults.Faults())
    run_dir.mkdir(exist_ok=True)
    trackers: Future = Future()
    trackers.set_result(Trackers([TensorBoard(str(run_dir / "tb"))]))
    trainer = Trainer(_config(*AUTO, f"train.max_steps={steps}"),
                      Context(0, 0, 1, torch.device("cpu"), str(run_dir), str(run_dir), None), trackers)
    try:
        trainer.maybe_resume()
        return trainer, trainer.train()
    finally:
        trainer.close()


def test_a_resume_keeps_the_fitted_micro_batch_and_the_record_of_how_it_was_found(gloo_group: None, tmp_path: Path):
    """Guards against a resume that forgets the fitted size (the checkpoint's plan not the fitted one, the hook not
    wired, the size not adopted before the data position is counted): the resumed launch would start over at 16 on a
    device where 16 fits, and train other steps than the uninterrupted run."""
    _, first = _launch(tmp_path / "run", 2, oom_above=4)
    assert first["micro_batch"]["chosen"] == 4 and first["micro_batch"]["out_of_memory"] == HALVINGS
    saved = ck.load(ck.latest(str(tmp_path / "run" / "checkpoints")))
    assert saved["plan"]["per_rank_batch"] == 4 and saved["plan"]["accumulation"] == 4, "the fitted plan"
    assert saved["micro_batch"] == first["micro_batch"], "the checkpoint records how the size was found"

    resumed, second = _launch(tmp_path / "run", 5, oom_above=None)  # room for 16 now: the size is kept all the same
    assert resumed.resumed_from is not None and resumed.resumed_from.endswith("step_2")
    assert (resumed.fit.plan.per_rank, resumed.feed.per_rank, resumed.accumulation) == (4, 4, 4)
    assert second["micro_batch"]["start"] == second["micro_batch"]["chosen"] == 4
    assert "kept on resume" in second["micro_batch"]["why"]
    assert second["micro_batch"]["out_of_memory"] == HALVINGS, "the earlier launch's halvings, kept"
    assert ck.load(ck.latest(str(tmp_path / "run" / "checkpoints")))["micro_batch"]["out_of_memory"] == HALVINGS

    _, whole = _launch(tmp_path / "whole", 5, oom_above=4)  # the uninterrupted run
    assert second["losses"] == whole["losses"] and len(whole["losses"]) == 5, "the same steps, bit for bit"


def _board(run_dir: Path) -> tuple[list[tuple[int, float]], list[str], dict[str, str]]:
    """TensorBoard's ``batch/micro`` points, the HPARAMS tab's metrics and its settings (as text)."""
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    settings = {k: v.string_value or str(v.number_value) for k, v in session.session_start_info.hparams.items()}
    return ([(e.step, e.value) for e in acc.Scalars("batch/micro")], [m.name.tag for m in experiment.metric_infos],
            settings)


def test_the_trackers_get_the_fitted_micro_batch_beside_the_plan_the_loop_started_at(gloo_group: None,
                                                                                      tmp_path: Path):
    """The plan and HPARAMS are written when the loop starts, before the fitting halves: TensorBoard says that
    ``batch.per_rank`` is auto, and logs the micro-batch of every step (``batch/micro``, every tracker gets it), a
    metric of the HPARAMS tab, so that the tab shows the fitted size beside the start."""
    _launch(tmp_path / "run", 2, oom_above=4)
    _launch(tmp_path / "run", 3, oom_above=None)  # a resume: its points continue the curve
    points, metrics, settings = _board(tmp_path / "run")
    assert points == [(1, 4.0), (2, 4.0), (3, 4.0)], "the size each step ran at, the halved one from step 1 on"
    assert "batch/micro" in metrics and "train/loss" in metrics
    assert settings["batch.per_rank"] == "auto", "the plan beside it is the start"
