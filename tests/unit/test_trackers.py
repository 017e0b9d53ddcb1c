"""The trackers' pure parts: parameters from config and plan, the default MLflow store, ``logger=a,b``, the CSV
file's rows and columns, the fan-out that drops a failing tracker loudly, the GPT -> GPT-2 parameter names, and the
validation of the new keys."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from ddp_runner.config import overrides, validate
from ddp_runner.contract import tracking
from ddp_runner.contract.errors import PlanError
from ddp_runner.tasks.engine.trackers.base import Background, Trackers
from ddp_runner.tasks.engine.trackers.csv_log import CsvLog


def test_params_hold_the_plan_and_the_flattened_config_as_text():
    conf = {"train": {"lr": 0.001, "betas": [0.9, 0.95], "note": "x" * 7000}, "task": {"model": {"layers": 1}},
            "logger": {"mlflow": {"tracking_uri": "http://h"}}, "hydra": {"x": 1}, "resume": "auto"}
    p = tracking.params(conf, {"global_batch": 32, "explanation": "global batch 32 = …"})
    assert p["plan.global_batch"] == "32" and p["plan.explanation"].startswith("global batch 32")
    assert p["train.lr"] == "0.001" and p["task.model.layers"] == "1" and p["resume"] == "auto"
    assert p["train.betas"] == "[0.9, 0.95]"
    assert len(p["train.note"]) == tracking.PARAM_VALUE_MAX
    assert not any(k.startswith(("logger.", "hydra.")) for k in p)


def test_default_mlflow_store_lives_under_a_local_output_root(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking.default_mlflow_uri(str(tmp_path)) == f"sqlite:///{tmp_path}/mlflow.db"
    assert tracking.default_mlflow_uri("s3://bucket/runs") is None
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracker:5000")
    assert tracking.default_mlflow_uri("s3://bucket/runs") == "http://tracker:5000"


def test_logger_with_commas_is_a_list_not_a_sweep():
    assert overrides.logger_list(["logger=tensorboard,mlflow", "train.lr=1,2", "logger=[csv]"]) == [
        "logger=[tensorboard,mlflow]", "train.lr=1,2", "logger=[csv]"]
    assert tracking.selected({"logger": {"wandb": {}, "tensorboard": {}}}) == ["tensorboard", "wandb"]


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_row_per_step_new_columns_widen_the_file_and_a_resume_keeps_the_rows_up_to_its_step(tmp_path):
    path = tmp_path / "metrics.csv"
    log = CsvLog(str(path))
    log.log({"train/loss": 2.0}, 1)
    log.log({"train/loss": 1.5}, 2)
    log.log({"val/loss": 1.7}, 2)  # the same step's validation: the same row
    log.log({"train/loss": 1.2}, 3)
    log.close()
    assert _rows(path) == [{"step": "1", "train/loss": "2.0", "val/loss": ""},
                           {"step": "2", "train/loss": "1.5", "val/loss": "1.7"},
                           {"step": "3", "train/loss": "1.2", "val/loss": ""}]
    again = CsvLog(str(path))  # a continued run after a checkpoint at step 2
    again.resume_at(2)
    again.log({"train/loss": 1.3}, 3)
    again.close()
    assert [(r["step"], r["train/loss"]) for r in _rows(path)] == [("1", "2.0"), ("2", "1.5"), ("3", "1.3")]


def test_csv_a_steps_validation_after_a_flush_goes_into_that_steps_row(tmp_path):
    # The final checkpoint flushes the trackers before the final validation logs its loss at the same step.
    path = tmp_path / "metrics.csv"
    log = CsvLog(str(path))
    log.log({"train/loss": 2.0}, 1)
    log.log({"train/loss": 1.5}, 2)
    log.flush()
    log.log({"val/loss": 1.7}, 2)
    log.log({"val/accuracy": 0.5}, 2)
    log.close()
    assert _rows(path) == [{"step": "1", "train/loss": "2.0", "val/loss": "", "val/accuracy": ""},
                           {"step": "2", "train/loss": "1.5", "val/loss": "1.7", "val/accuracy": "0.5"}]
    again = CsvLog(str(path))  # a continued run that only validates its last step (docs/resume.md)
    again.log({"val/loss": 1.6}, 2)
    again.close()
    assert [(r["step"], r["val/loss"]) for r in _rows(path)] == [("1", ""), ("2", "1.6")]


class _Memory:
    def __init__(self, name: str, fail_at: int | None = None) -> None:
        self.name, self.fail_at, self.points, self.closed = name, fail_at, [], False

    def log(self, scalars, step):
        if step == self.fail_at:
            raise ConnectionError("server went away")
        self.points.append((step, dict(scalars)))

    def resume_at(self, step):
        pass

    def flush(self):
        pass

    def close(self):
        self.closed = True


@pytest.mark.parametrize("background", [False, True])
def test_a_failing_tracker_is_reported_once_and_dropped_while_the_others_go_on(background, capsys):
    ok, bad = _Memory("csv"), _Memory("mlflow", fail_at=2)
    fan = Trackers([ok, Background(bad) if background else bad])
    for step in (1, 2, 3):
        fan.log({"train/loss": float(step)}, step)
        fan.flush()
    fan.close()
    assert [s for s, _ in ok.points] == [1, 2, 3] and [s for s, _ in bad.points] == [1]
    assert fan.report() == {"ok": ["csv"], "failed": {"mlflow": "ConnectionError: server went away"}}
    assert capsys.readouterr().out.count("logger mlflow failed") == 1


def test_gpt_parameters_map_onto_gpt2_names_with_conv1d_weights_transposed():
    from ddp_runner.tasks.gpt.hf import to_hf
    from ddp_runner.tasks.gpt.model import GPT

    model = GPT(vocab=32, context=8, width=16, layers=2, heads=2)
    hf = to_hf(model.state_dict())
    assert "lm_head.weight" not in hf and "transformer.h.1.attn.c_attn.weight" in hf
    assert torch.equal(hf["transformer.h.0.mlp.c_fc.weight"], model.blocks[0].fc.weight.t())
    assert hf["transformer.h.0.attn.c_attn.weight"].shape == (16, 48)
    assert len(hf) == 4 + 2 * 12
    with pytest.raises(ValueError, match="linear.weight"):
        to_hf({"linear.weight": torch.zeros(2, 2)})


@pytest.mark.parametrize("key, value", [("logger.wandb.mode", "cloud"), ("logger.mlflow.on_unreachable", "ignore"),
                                        ("checkpoint.export", "onnx")])
def test_logger_and_export_keys_are_checked(key, value):
    section, *rest = key.split(".")
    cfg: dict = {section: {}}
    node = cfg[section]
    for part in rest[:-1]:
        node = node.setdefault(part, {})
    node[rest[-1]] = value
    with pytest.raises(PlanError) as err:
        validate.check_engine(cfg)
    assert err.value.key == key


def test_hf_export_at_every_checkpoint_is_refused_for_a_task_other_than_gpt():
    with pytest.raises(PlanError, match="GPT task"):
        validate.check_engine({"checkpoint": {"export": "hf"}, "task": {"module": "ddp_runner.tasks.smoke"}})
    validate.check_engine({"checkpoint": {"export": "hf"}, "task": {"module": validate.GPT_MODULE}})


def test_log_points_queued_behind_a_slow_request_go_out_together_in_order():
    import threading

    gate = threading.Event()

    class Slow(_Memory):
        calls: list[int] = []

        def log_many(self, points):
            gate.wait(5)  # the first request is in flight while the loop queues more
            self.calls.append(len(points))
            for scalars, step in points:
                self.log(scalars, step)

    inner = Slow("mlflow")
    bg = Background(inner)
    for step in range(1, 11):
        bg.log({"train/loss": float(step)}, step)
    gate.set()
    bg.flush()
    bg.close()
    assert [s for s, _ in inner.points] == list(range(1, 11))
    assert sum(inner.calls) == 10 and len(inner.calls) <= 2 and inner.closed


def test_wandb_runs_get_an_id_the_sweep_group_and_a_continued_run_keeps_its_own():
    from ddp_runner.trackers.runs import finish, open_runs

    conf = {"logger": {"tensorboard": {}, "csv": {}, "wandb": {"project": "p", "entity": None, "mode": "offline"}}}
    job = open_runs(conf, {"global_batch": 8}, "/o/d/12-00-00_sweep/0_gpt_w1", "/o/d/12-00-00_sweep", None)
    assert job["tensorboard"] == {"dir": "tb"} and job["csv"] == {"path": "metrics.csv"}
    w = job["wandb"]
    assert len(w["id"]) == 8 and w["group"] == "12-00-00_sweep" and w["mode"] == "offline" and w["project"] == "p"
    other = open_runs(conf, {"global_batch": 8}, "/o/d/12-00-00_sweep/1_gpt_w1", "/o/d/12-00-00_sweep", None)
    assert other["wandb"]["id"] != w["id"] and other["wandb"]["group"] == w["group"]
    assert open_runs(conf, {}, "/o/d/x", None, job)["wandb"] == w, "a continued run goes on under its own id"
    assert finish(conf, job, "completed") is None  # nothing to close without MLflow


def test_run_json_records_a_tracking_uri_without_its_credentials():
    assert tracking.redact_uri("https://user:tok@mlflow.example.com/x") == "https://***@mlflow.example.com/x"
    assert tracking.redact_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert tracking.redact_uri("sqlite:////tmp/a@b/mlflow.db") == "sqlite:////tmp/a@b/mlflow.db"
    conf = {"logger": {"mlflow": {"tracking_uri": "http://h:1"}}, "output": {"root": "outputs"}}
    assert tracking.mlflow_uri(conf) == "http://h:1"
