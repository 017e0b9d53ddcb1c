"""A stop in a validation, mid-run or after the last optimizer step, in the real Trainer (a one-process gloo group,
the tiny GPT): the ranks leave the validation at their next vote and the checkpoint of the step they stopped after is
committed first; after the final checkpoint and validation a stop cuts nothing (issue 45, item 1).

The stop comes as a SIGTERM would bring it to a rank (``termination``'s flag), set when the validation begins: its
progress phase (``heartbeat.phase("validation")``), so that it lands in the validation on any machine.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ddp_runner.tasks.engine import checkpoint as ck
from ddp_runner.tasks.engine.diagnostics import heartbeat
from ddp_runner.tasks.engine.stop import signals as termination

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stops() -> Iterator[None]:
    """termination's module state as a fresh rank has it, before and after (it is this process's)."""
    def reset() -> None:
        termination._requested, termination._requested_after = 0, None  # noqa: SLF001 - a rank's own flags
        for event in (termination._accepting, termination._taken, termination._done):  # noqa: SLF001
            event.clear()

    reset()
    yield
    reset()


def _config(tmp: Path, **train: Any) -> Any:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from ddp_runner.tasks.engine.config import Config

    text = tmp / "tiny.txt"
    text.write_bytes(bytes(range(32, 127)) * 40)
    overrides = ["task=gpt", "device=cpu", "world_size=1", f"data.path={text}", "task.model.width=16",
                 "task.model.context=16", "batch.per_rank=4", "train.val_samples=16", "train.warmup_steps=1",
                 "checkpoint.every_steps=0", *[f"train.{k}={v}" for k, v in train.items()]]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)
    cfg["output"]["root"] = str(tmp / "outputs")
    return Config(cfg)


def _train(tmp: Path, monkeypatch: pytest.MonkeyPatch, stop_in_validation_at: int | None,
           **train: Any) -> tuple[Any, dict[str, Any], list[int]]:
    """Train the tiny GPT to the end (or a stop), a SIGTERM arriving when the validation at step
    ``stop_in_validation_at`` begins; returns the trainer, its summary, and the validation batches it ran."""
    from ddp_runner.tasks.engine.rank import Context
    from ddp_runner.tasks.engine.trainer import Trainer

    run = tmp / "run"
    (run / "logs").mkdir(parents=True)
    trainer = Trainer(_config(tmp, **train), Context(0, 0, 1, torch.device("cpu"), str(run), str(run), None))
    phase = heartbeat.phase

    def and_a_stop(name: str) -> None:
        if name == "validation" and trainer.state.step == stop_in_validation_at:
            termination._requested = signal.SIGTERM  # noqa: SLF001 - what the watcher sets as SIGTERM comes
        phase(name)

    monkeypatch.setattr(heartbeat, "phase", and_a_stop)
    batches: list[int] = []
    monkeypatch.setattr(heartbeat, "tick", lambda: batches.append(trainer.state.step))
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    return trainer, summary, batches


def test_a_stop_during_a_mid_run_validation_saves_that_step_before_anything_else(tmp_path, monkeypatch, gloo_group,
                                                                                  stops):
    trainer, summary, batches = _train(tmp_path, monkeypatch, 2, max_steps=6, val_every=2)
    assert trainer.stopped is not None and trainer.stopped["step"] == 2, trainer.stopped
    assert trainer.stopped["during"] == "the validation at step 2" and not trainer.stopped["last_step"]
    assert batches == [2], "the validation was left at its first vote"
    assert summary["steps"] == 2 and summary["val_loss"] is None and summary["validation"] is None
    assert ck.latest(str(tmp_path / "run" / "checkpoints")).endswith("step_2")
    assert trainer.model.training, "the model is back in training mode"
    assert termination._done.is_set()  # noqa: SLF001 - the watcher lets the process end by itself


def test_a_stop_during_the_final_validation_keeps_the_final_checkpoint(tmp_path, monkeypatch, gloo_group, stops):
    trainer, summary, batches = _train(tmp_path, monkeypatch, 3, max_steps=3, val_every=0)
    assert trainer.stopped is not None, "the stop was taken, not ignored"
    assert trainer.stopped["step"] == 3 and trainer.stopped["last_step"], trainer.stopped
    assert trainer.stopped["during"] == "the final validation" and trainer.stopped["checkpoint"] == "step_3"
    assert batches == [3] and summary["val_loss"] is None
    final = ck.latest(str(tmp_path / "run" / "checkpoints"))
    assert final.endswith("step_3") and ck.load(final)["progress"]["step"] == 3


def test_after_the_final_checkpoint_and_validation_a_stop_cuts_nothing(tmp_path, monkeypatch, gloo_group, stops):
    trainer, summary, batches = _train(tmp_path, monkeypatch, None, max_steps=3, val_every=0)
    assert trainer.stopped is None and summary["val_loss"] is not None and batches
    assert ck.latest(str(tmp_path / "run" / "checkpoints")).endswith("step_3")
    # Every step is committed: a SIGTERM from here on lets the process end by itself (the driver then records the
    # run completed: runner/supervise/stop/outcome.py).
    assert termination._done.is_set()  # noqa: SLF001
