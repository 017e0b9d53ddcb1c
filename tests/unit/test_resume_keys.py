"""What may change on resume (issue 30): one table, checked before launch and printed in docs/resume.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_runner.contract.errors import PlanError
from ddp_runner.rundir import resume_keys

THEIRS = {"train": {"lr": 1e-4, "grad_clip": None, "max_steps": 10, "log_every": 1},
          "task": {"name": "gpt", "model": {"width": 64}}, "data": {"path": "http://u:***@h/x", "val_path": None},
          "checkpoint": {"keep_last": 2}, "resume": "auto", "output": {"root": "a"}}


def _with(**changes: object) -> dict:
    import copy

    conf = copy.deepcopy(THEIRS)
    for key, value in changes.items():
        *parents, last = key.split("__")
        node = conf
        for p in parents:
            node = node[p]
        node[last] = value
    return conf


@pytest.mark.parametrize(("key", "value", "old"), [("train__lr", 0.01, 1e-4),
                                                   ("task__model__width", 128, 64),
                                                   ("data__path", "/other.txt", "http://u:***@h/x")])
def test_a_key_the_checkpoint_fixes_is_refused_with_its_reason(key: str, value: object, old: object) -> None:
    with pytest.raises(PlanError) as err:
        resume_keys.check(THEIRS, _with(**{key: value}), "src", 10)
    dotted = key.replace("__", ".")
    assert err.value.key == dotted and err.value.value == value
    assert f"({old!r})" in err.value.problem
    assert "cannot change on resume" in err.value.problem and f"{dotted}={old}" in err.value.fix


def test_other_changes_apply_and_are_recorded_with_their_step() -> None:
    mine = _with(train__grad_clip=1.0, train__max_steps=20, checkpoint__keep_last=0, resume="x/step_10",
                 output__root="b", data__val_path="/val.txt")
    # The same URL with its password: config.yaml holds it masked, so it compares masked.
    mine["data"]["path"] = "http://u:secret@h/x"
    changes = resume_keys.check(THEIRS, mine, "x/step_10", 10)
    assert changes == {"train.grad_clip": {"checkpoint": None, "used": 1.0, "from_step": 10},
                       "train.max_steps": {"checkpoint": 10, "used": 20, "from_step": 10},
                       "checkpoint.keep_last": {"checkpoint": 2, "used": 0, "from_step": 10},
                       "data.val_path": {"checkpoint": None, "used": "/val.txt", "from_step": 10}}


def test_docs_hold_the_table() -> None:
    page = (Path(__file__).parents[2] / "docs" / "resume.md").read_text()
    assert resume_keys.docs_table() in page


def test_ddp_and_zero1_swap_but_fsdp_does_not() -> None:
    theirs = {**THEIRS, "strategy": {"name": "ddp"}}
    changes = resume_keys.check(theirs, {**THEIRS, "strategy": {"name": "zero1"}}, "src", 4)
    assert changes == {"strategy.name": {"checkpoint": "ddp", "used": "zero1", "from_step": 4}}
    with pytest.raises(PlanError, match="strategy.name"):
        resume_keys.check(theirs, {**THEIRS, "strategy": {"name": "fsdp"}}, "src", 4)


def test_a_key_newer_than_the_checkpoints_run_is_no_difference() -> None:
    assert resume_keys.check(THEIRS, _with(task__model__dropout=0.0), "src", 4) == {}
