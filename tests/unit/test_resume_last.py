"""Issue 45 item 3 (runner/rundir/resume_last.py): the keys given beside ``resume=last`` that a continued run could
not take (a config group such as ``task=gpt``, ``world_size``, a key the checkpoint fixes) choose among the
unfinished runs: the newest whose values match is continued, or the resume is refused naming the candidates. The
keys that only say how to continue, and the settings a continued run may change, choose nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ddp_runner.contract import checkpoints
from ddp_runner.contract.errors import PlanError
from ddp_runner.rundir import resume_last


def _composed(task: str = "smoke", **top) -> dict:
    return {"task": {"name": task, "model": {"width": 32}}, "seed": 7, "world_size": 2, "resume": "last",
            "train": {"lr": 3e-4, "log_every": 1, "max_steps": None}, "data": {"name": "synthetic", "path": None},
            "output": {"root": "outputs"}, "dry_run": False, **top}


def _run(root: Path, name: str, preset: str | None, conf: dict, status: str = "interrupted") -> Path:
    """A run directory as the driver reads it before launch: config.yaml, run.json, one committed checkpoint."""
    run = root / "2026-01-01" / name
    (run / "checkpoints" / "step_2").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(conf))
    (run / "run.json").write_text(json.dumps({"status": status, "plan": {"world_size": conf["world_size"]},
                                              "invocation": {"task_preset": preset}}))
    marker = {"format": checkpoints.FORMAT, "step": 2, "bytes": 0, "sha256": "", "state_file": "state.pt"}
    (run / "checkpoints" / "step_2" / "state.pt").write_bytes(b"")  # of the size the marker records
    (run / "checkpoints" / "step_2" / "meta.json").write_text(json.dumps(marker))
    return run


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Under one output root, oldest first: a gpt run (lr 1e-3), a smoke run (seed 5), a smoke run (the newest), and
    a completed gpt run (never continued by resume=last)."""
    root = tmp_path / "outputs"
    _run(root, "09-00-00_gpt_w2", "gpt", {**_composed("gpt"), "train": {"lr": 1e-3}})
    _run(root, "10-00-00_smoke_w2", "smoke", _composed(seed=5))
    _run(root, "11-00-00_smoke_w1", None, _composed(world_size=1))  # an older run.json: no task_preset
    _run(root, "12-00-00_gpt_w2", "gpt", _composed("gpt"), status="completed")
    return root


def _choose(root: Path, *given: str, task: str = "smoke") -> str:
    run, _ = resume_last.choose(str(root), _composed(task), ["resume=last", *given, f"output.root={root}"])
    return Path(run).name


def test_without_keys_the_newest_unfinished_run_is_continued(root: Path):
    assert _choose(root) == "11-00-00_smoke_w1"
    assert _choose(root, "train.max_steps=50", "dry_run=true", "train.log_every=5") == "11-00-00_smoke_w1"


def test_a_task_chooses_the_newest_unfinished_run_of_that_task(root: Path):
    assert _choose(root, "task=gpt", task="gpt") == "09-00-00_gpt_w2"  # was: the newer smoke run, task=gpt ignored
    assert _choose(root, "task=smoke") == "11-00-00_smoke_w1"  # a run.json without task_preset: its task's name


def test_fixed_keys_and_world_size_choose_too(root: Path):
    run, want = resume_last.choose(str(root), _composed(seed=5), ["resume=last", "seed=5", "train.log_every=3"])
    assert Path(run).name == "10-00-00_smoke_w2" and want.values == {"seed": 5} and want.given == ["seed=5"]
    composed = _composed("gpt", train={"lr": 0.001})
    run, _ = resume_last.choose(str(root), composed, ["resume=last", "task=gpt", "train.lr=1e-3"])
    assert Path(run).name == "09-00-00_gpt_w2"  # 1e-3 and 0.001 are one learning rate
    run, _ = resume_last.choose(str(root), _composed(world_size=2), ["resume=last", "world_size=2"])
    assert Path(run).name == "10-00-00_smoke_w2"


def test_no_match_is_refused_naming_the_candidates(root: Path):
    with pytest.raises(PlanError) as exc:
        resume_last.choose(str(root), _composed("gpt", seed=9), ["resume=last", "task=gpt", "seed=9"])
    err = exc.value
    assert (err.key, err.value) == ("resume", "last")
    assert "has task=gpt seed=9" in err.problem
    for name, has in (("11-00-00_smoke_w1", "task=smoke, seed=7"), ("10-00-00_smoke_w2", "task=smoke, seed=5"),
                      ("09-00-00_gpt_w2", "task=gpt, seed=7")):
        assert f"{name} (interrupted; {has})" in err.problem
    assert "12-00-00_gpt_w2" not in err.problem  # completed: not a candidate
    assert "resume=<run dir>" in err.fix


def test_nothing_unfinished_is_refused_as_before(tmp_path: Path):
    with pytest.raises(PlanError, match="no unfinished run with a checkpoint under output.root="):
        resume_last.choose(str(tmp_path / "empty"), _composed(), ["resume=last", "task=gpt"])


def test_wanted_keeps_only_the_keys_that_choose():
    want = resume_last.wanted(["resume=last", "output.root=/x", "dry_run=true", "train.max_steps=9", "task=gpt",
                               "train.log_every=5", "+hydra.job.x=1", "fault.kind=exception", "~train.grad_clip",
                               "data.path=tokens.bin", "world_size=4", "task.model.width=64"],
                              {**_composed("gpt", world_size=4, data={"name": "text", "path": "tokens.bin"}),
                               "task": {"name": "gpt", "model": {"width": 64}}})
    assert want.values == {"task": "gpt", "data.path": str(Path("tokens.bin").resolve()), "world_size": 4,
                           "task.model.width": 64}
    assert resume_last.same(3e-4, 0.0003) and resume_last.same(2, 2.0) and not resume_last.same("gpt", "smoke")
    assert resume_last.same("s3://u:secret@host/b", "s3://u:other@host/b")  # as config.yaml records it: masked


def test_a_node_of_a_multinode_or_kubernetes_job_is_not_told_it_starts_a_new_run(root: Path, capsys):
    # Its run directory is the job's own (<rdzv_id>_<task>_w<N>), continued from its checkpoint after a restart: the
    # note about another unfinished run under the root, "a new run from step 0", would be wrong there.
    from ddp_runner.job import execute

    how = execute.Invocation(argv=["ddp-run"])
    for name in ("local", "multinode", "kubernetes"):
        conf = {**_composed(), "resume": "auto", "output": {"root": str(root)}, "launcher": {"name": name}}
        execute._say_where_it_starts(conf, None, how)
        said = capsys.readouterr().err
        assert ("this is a new run from step 0" in said) == (name == "local"), (name, said)
