"""Issue 51 item 2: a task that loads its own dataset (tests/support/user_tasks/own_file_regression.py: 32,768
records from a file of its own, whatever data.num_samples says) must not be refused with data.num_samples' default
(64) while its ranks would train on 32,768. Its checks module's ``train_samples(cfg)`` tells the driver the real
size before it plans; run.json's plan records it. Without the hook, the refusal says where its count came from
and how to give the real one, and a rank that builds another size than the plan's stops before any step."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_runner.contract.errors import PlanError

USER_TASKS = Path(__file__).resolve().parents[1] / "support" / "user_tasks"
TASK = ["task.module=own_file_regression", "batch.per_rank=64", "world_size=2", "device=cpu", "dry_run=true"]
HOOK = "task.checks=own_file_regression_checks"


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The task's file: 32,768 records."""
    monkeypatch.syspath_prepend(str(USER_TASKS))
    import own_file_regression

    path = tmp_path / "records.bin"
    own_file_regression.write(str(path), 32768)
    return path


def test_the_task_tells_the_driver_its_size_and_the_plan_records_it(records: Path, out_root: Path, cli):
    r = cli([*TASK, HOOK, f"+task.file={records}"], out_root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "global batch 128 = 64 per rank × 2 ranks" in r.stdout and "train_samples: 32768" in r.stdout, r.stdout


def test_without_the_hook_the_refusal_names_its_count_source_and_the_hook(records: Path, out_root: Path, cli):
    r = cli([*TASK, f"+task.file={records}"], out_root)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "the training set has 64 samples (data.num_samples)" in r.stderr, r.stderr
    assert "train_samples(cfg) in its task.checks module" in r.stderr.replace("\n", " "), r.stderr


@pytest.mark.parametrize("answer, says", [("0", "returned 0, not a count"), ("'many'", "returned 'many'"),
                                          ("1 // 0", "raised ZeroDivisionError")])
def test_a_hook_that_gives_no_count_is_refused_naming_the_checks_module(answer: str, says: str, tmp_path: Path):
    from ddp_runner.config.task_module import own_train_samples

    name = f"bad_checks_{abs(hash(answer))}"  # a module of its own per case: imports are cached
    (tmp_path / f"{name}.py").write_text(f"def train_samples(cfg):\n    return {answer}\n")
    with pytest.raises(PlanError) as err:
        own_train_samples({"task": {"checks": name}}, str(tmp_path))
    assert err.value.key == "task.checks" and says in err.value.problem, err.value


def test_a_rank_that_builds_another_size_than_the_plan_stops_naming_both(records: Path):
    from ddp_runner.tasks import registry
    from ddp_runner.tasks.api import Config

    cfg = Config({"task": {"module": "own_file_regression", "file": str(records)},
                  "data": {"name": "synthetic", "num_samples": 256}})
    with pytest.raises(PlanError) as err:
        registry.build(cfg, "cpu")
    assert err.value.key == "data.num_samples" and err.value.value == 256
    assert "planned with 256 training samples" in err.value.problem and "made 32768" in err.value.problem
    assert "data.num_samples=32768" in err.value.fix and "train_samples(cfg)" in err.value.fix
    cfg = Config({"task": {"module": "own_file_regression", "file": str(records)},
                  "data": {"name": "synthetic", "num_samples": 32768}})
    assert len(registry.build(cfg, "cpu").train_set) == 32768
