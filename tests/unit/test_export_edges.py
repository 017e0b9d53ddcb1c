"""Issue 51's export polish: ``export.json`` says what a custom task's weights are (its task.* settings, where a
built-in task has ``task.model``), and ``ddp-export <run>/checkpoints/step_N`` on a step whose save never committed
says so and names the newest committed one (it used to look for ``step_N/checkpoints``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ddp_runner.tasks import export as export_cli
from ddp_runner.tasks.engine.checkpoint import export, storage

CUSTOM = "task:\n  name: mytask\n  module: mytask\n  checks: null\n  classes: 3\n  hidden: 64\n"
GPT = "task:\n  name: gpt\n  module: ddp_runner.tasks.gpt.task\n  model:\n    layers: 2\n    width: 64\n"


def _state(step: int, config: str = CUSTOM) -> dict:
    return {"model": {"w": torch.full((4,), float(step))}, "progress": {"step": step, "losses": [1.0 / step]},
            "config": config, "plan": {"world_size": 1}}


def test_a_custom_tasks_export_records_its_task_settings() -> None:
    info = export.describe(_state(2))
    assert info["task"] == "mytask" and info["module"] == "mytask"
    assert info["model"] == {"classes": 3, "hidden": 64}  # was: None


def test_a_builtin_tasks_export_keeps_its_model_config() -> None:
    assert export.describe(_state(2, GPT))["model"] == {"layers": 2, "width": 64}


def test_a_task_with_no_settings_of_its_own_has_no_model() -> None:
    assert export.describe(_state(2, "task:\n  name: bare\n  module: bare\n"))["model"] is None


def test_an_uncommitted_step_is_named_so_with_the_newest_committed_one(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    ckpts = tmp_path / "run" / "checkpoints"
    for step in (2, 4):
        storage.save(str(ckpts), step, _state(step), keep_last=0)
    shutil.copytree(ckpts / "step_4", ckpts / "step_6")
    (ckpts / "step_6" / "meta.json").unlink()  # a save that never committed
    with pytest.raises(SystemExit) as exc:
        export_cli.main([str(ckpts / "step_6"), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "step_6/checkpoints" not in err, err
    assert "step_6 is not committed (incomplete" in err, err
    assert f"the newest committed one is step_4: ddp-export {ckpts / 'step_4'}" in err, err
    assert not (tmp_path / "out").exists()


def test_an_uncommitted_step_with_none_committed_says_there_is_none(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    step = tmp_path / "run" / "checkpoints" / "step_2"
    step.mkdir(parents=True)
    torch.save(_state(2), step / "state.pt")
    with pytest.raises(SystemExit):
        export_cli.main([str(step), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "step_2 is not committed (incomplete" in err and "no committed checkpoint in this run" in err, err


def test_a_committed_step_still_exports(tmp_path: Path) -> None:
    ckpts = tmp_path / "run" / "checkpoints"
    storage.save(str(ckpts), 2, _state(2), keep_last=0)
    export_cli.main([str(ckpts / "step_2"), "--out", str(tmp_path / "out")])
    assert json.loads((tmp_path / "out" / "export.json").read_text())["model"] == {"classes": 3, "hidden": 64}


def test_hf_format_still_refuses_a_custom_tasks_settings(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from ddp_runner.tasks.gpt import hf

    with pytest.raises(ValueError, match="no task.model: not the GPT task's model"):
        hf.write({}, export.describe(_state(2)), str(tmp_path / "hf"))
