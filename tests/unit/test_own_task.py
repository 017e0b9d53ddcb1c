"""A task of the user's own: its name when given only by its module, the refusal of an unknown task, and where an
error in the user's code is reported (their file and line, not the engine's or torch's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from ddp_runner.config import overrides
from ddp_runner.config.task_module import from_file, module_only, task_name
from ddp_runner.contract.errors import PlanError
from ddp_runner.diagnostics.rootcause import root_cause
from ddp_runner.tasks import registry
from ddp_runner.tasks.engine import worker_io


@pytest.mark.parametrize("module, name", [
    ("mytask", "mytask"), ("mypkg.image_cls", "image_cls"), ("ddp_runner.tasks.gpt.task", "gpt"), ("task", "task"),
    (None, "task"), ("my-odd.name", "name"), ("sub/dir/my_task.py", "my_task"), ("mytask.py", "mytask"),
])
def test_a_module_names_its_task(module, name):
    assert task_name(module) == name


@pytest.mark.parametrize("args, only", [
    (["task.module=mytask"], True),
    (["task.module=mytask", "+task.classes=4", "world_size=2"], True),
    (["task=smoke", "task.module=mytask"], False),  # a preset asked for: its keys and checks are wanted
    (["task=mytask"], False),
    (["world_size=2"], False),
])
def test_only_a_module_without_a_preset_composes_the_neutral_preset(args, only):
    assert module_only(args) is only


def test_a_task_file_runs_as_its_module_from_its_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "my_task.py").write_text("def build(cfg, device):\n    pass\n")
    assert from_file("sub/my_task.py", cwd=str(tmp_path)) == ("my_task", str(tmp_path / "sub"))
    assert from_file("mypkg.my_task", cwd=str(tmp_path)) == ("mypkg.my_task", None)
    with pytest.raises(PlanError, match="no such file"):
        from_file("sub/nope.py", cwd=str(tmp_path))
    (tmp_path / "my-task.py").write_text("")
    with pytest.raises(PlanError, match="not a Python module name"):
        from_file("my-task.py", cwd=str(tmp_path))


def test_an_unknown_task_is_refused_with_both_ways_and_the_presets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fix = overrides.task_fix("mytask", ["custom", "gpt", "smoke"])
    assert "--config-dir <folder> task=mytask" in fix and "<folder>/task/mytask.yaml" in fix
    assert "task.module=<your module>" in fix and "built-in presets: gpt, smoke" in fix
    (tmp_path / "mytask.py").write_text("def build(cfg, device):\n    pass\n")
    fix = overrides.task_fix("mytask", ["gpt", "smoke"])
    assert fix.startswith("name your own task either way: task.module=mytask (")
    assert "mytask is importable here" in fix
    (tmp_path / "conf" / "task").mkdir(parents=True)
    (tmp_path / "conf" / "task" / "mytask.yaml").write_text("task: {}\n")
    fix = overrides.task_fix("mytask", ["gpt", "smoke"])
    assert fix.startswith("name your own task either way: --config-dir conf task=mytask (conf/task/mytask.yaml is"
                          " here), or task.module=mytask"), fix


USER_TASK = '''\
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.lin(x).mean()


def build(cfg, device):
    raise ValueError("no data here")
'''


@pytest.fixture
def user_task(tmp_path, monkeypatch):
    """The user's task module, imported the way the workers import it."""
    (tmp_path / "usertask_where.py").write_text(USER_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = registry.import_task("usertask_where")
    yield module
    sys.modules.pop("usertask_where", None)


def test_an_error_raised_in_the_users_code_points_at_their_line(user_task, tmp_path):
    with pytest.raises(ValueError) as info:
        user_task.build(None, torch.device("cpu"))
    where = registry.where_in_task(info.value)
    assert where == f"{tmp_path / 'usertask_where.py'}:14 in build"


def test_a_forward_called_with_the_wrong_signature_points_at_its_definition(user_task, tmp_path):
    model = user_task.Net()
    with pytest.raises(TypeError) as info:
        model(torch.zeros(1, 2), torch.zeros(1))  # the engine's call: model(x, y)
    assert registry.where_in_task(info.value) == (
        f"{tmp_path / 'usertask_where.py'}:9 in Net.forward (the engine calls model(x, y))")


def test_the_error_record_carries_the_users_line_and_the_root_cause_names_it(user_task, tmp_path):
    with pytest.raises(ValueError) as info:
        user_task.build(None, torch.device("cpu"))
    (tmp_path / "logs").mkdir()
    worker_io.record_error(str(tmp_path), 1, info.value)
    err = json.loads((tmp_path / "logs" / "rank1.error.json").read_text())
    assert err["where"].endswith("usertask_where.py:14 in build")
    cause = root_cause({"world_size": 2, "errors": {1: err}, "rc": 1})
    assert cause["rank"] == 1 and cause["where"] == err["where"]


def test_an_error_at_the_top_of_the_users_module_points_at_its_line(tmp_path, monkeypatch):
    (tmp_path / "usertask_top.py").write_text("import torch\n\nSIZE = undefined_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(NameError) as info:
        registry.import_task("usertask_top")
    assert registry.where_in_task(info.value) == f"{tmp_path / 'usertask_top.py'}:3 in <module>"


def test_an_error_in_the_engine_is_not_blamed_on_the_task(user_task):
    try:
        Path("/nonexistent/file").read_text()
    except OSError as exc:
        assert registry.where_in_task(exc) is None
