"""Trackers and export in this process: refusals before launch (a tracker not installed names its extra; a tracker
that cannot be reached refuses, or with on_unreachable=warn is dropped), the Hugging Face folder with the tokenizer
ddp-tokenize made, and fsdp's DCP shards consolidated without a process group."""

from __future__ import annotations

import importlib.util
import json
import socket

import pytest
import torch

from ddp_runner.contract import tracking
from ddp_runner.contract.errors import PlanError


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


def test_a_tracker_not_installed_is_refused_naming_its_extra(cli, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    r = cli(["task=smoke", "device=cpu", "world_size=1", "logger=tensorboard,wandb"], tmp_path / "out")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "pip install 'ddp-runner[wandb]'" in r.stderr and "logger='wandb'" in r.stderr
    assert not (tmp_path / "out").exists(), "refused before any run directory"


def test_an_unreachable_mlflow_server_refuses_the_launch_before_anything_starts(cli, tmp_path):
    uri = f"http://127.0.0.1:{_closed_port()}"
    r = cli(["task=smoke", "device=cpu", "world_size=1", "logger=[mlflow]", f"logger.mlflow.tracking_uri={uri}"],
            tmp_path / "out")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "logger.mlflow" in r.stderr and "cannot be reached" in r.stderr and "on_unreachable=warn" in r.stderr
    assert not (tmp_path / "out").exists()


def test_on_unreachable_warn_drops_that_tracker_and_keeps_the_others():
    from ddp_runner.trackers.preflight import check_reachable

    conf = {"output": {"root": "outputs"}, "logger": {
        "tensorboard": {}, "mlflow": {"tracking_uri": f"http://127.0.0.1:{_closed_port()}", "on_unreachable": "warn"}}}
    [warning] = check_reachable(conf)
    assert "logger mlflow cannot be reached" in warning and list(conf["logger"]) == ["tensorboard"]


def test_the_default_mlflow_store_cannot_live_under_a_remote_root(monkeypatch):
    from ddp_runner.trackers.preflight import mlflow_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(PlanError, match="tracking_uri"):
        mlflow_uri({"output": {"root": "s3://bucket/runs"}, "logger": {"mlflow": {"tracking_uri": None}}})


def test_hf_folder_carries_ddp_tokenize_tokenizer_and_matches_our_logits(tokenized, tmp_path):
    """A GPT over the BPE's 1000 ids: the folder's tokenizer encodes as ddp-tokenize's does, end-of-text is
    BOS/EOS, and transformers' logits equal ours within 1e-5 (fp32, CPU)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from ddp_runner.tasks.gpt import hf
    from ddp_runner.tasks.gpt.model import GPT

    _corpus, out, _files, _r = tokenized
    model_cfg = {"vocab": 1000, "context": 32, "width": 32, "layers": 2, "heads": 4, "dropout": 0.0}
    torch.manual_seed(0)
    ours = GPT(**{k: v for k, v in model_cfg.items()}).eval()
    assert hf.tokenizer_dir(str(out / "train.bin")) == str(out)
    hf.write(ours.state_dict(), {"task": "gpt", "model": model_cfg, "step": 7}, str(tmp_path / "hf"),
             tokenizer_dir=str(out))
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "def heapify(x):\n    return sorted(x)  # café"
    assert tok(text)["input_ids"] == Tokenizer.from_file(str(out / "tokenizer.json")).encode(text).ids
    assert tok.eos_token == "<|endoftext|>"
    theirs = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert theirs.config.eos_token_id == tok.eos_token_id
    ids = torch.tensor([tok(text)["input_ids"][:32]])
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, ours(ids), atol=1e-5, rtol=1e-5)
    assert json.loads((tmp_path / "hf" / "export.json").read_text())["tokenizer"] is True


def test_fsdp_shards_are_consolidated_without_a_process_group(tmp_path):
    import torch.distributed.checkpoint as dcp

    from ddp_runner.tasks.engine.checkpoint.export import _consolidate

    model = {"tok.weight": torch.randn(8, 4), "blocks.0.fc.bias": torch.randn(16)}
    dcp.save({"model": {k: v.clone() for k, v in model.items()}, "optimizer": {"state": {"x": torch.ones(3)}}},
             checkpoint_id=str(tmp_path / "shards"), no_dist=True)
    got = _consolidate(str(tmp_path / "shards"))
    assert got.keys() == model.keys() and all(torch.equal(got[k], model[k]) for k in model)


def test_a_setting_of_a_logger_not_selected_is_refused_naming_it(cli, tmp_path):
    r = cli(["task=smoke", "device=cpu", "dry_run=true", "logger.mlflow.tracking_uri=http://127.0.0.1:5000"],
            tmp_path / "out")
    assert r.returncode == 2 and "key:   logger.mlflow.tracking_uri" in r.stderr, r.stderr
    assert "logger=[tensorboard,mlflow]" in r.stderr


# The driver's side of an MLflow run against the real server, in a fresh interpreter (this one has imported MLflow):
# the preflight, a sweep job's run opened under its parent, reopened as a continued run with a changed parameter,
# then closed; MLflow itself never imported.
_DRIVER_SIDE = """
import json, sys
from ddp_runner.trackers import preflight, runs
uri, sweep = sys.argv[1], sys.argv[2]
conf = {"output": {"root": "outputs"}, "task": {"name": "smoke"}, "train": {"lr": 0.1},
        "logger": {"mlflow": {"tracking_uri": uri, "experiment": "driver-rest"}}}
plan = {"world_size": 2, "global_batch": 16}
preflight.preflight(conf)
rec = runs.open_runs(conf, plan, sweep + "/0_job", sweep, None)
conf["train"]["lr"] = 0.2
again = runs.open_runs(conf, plan, sweep + "/0_job", sweep, rec)
warning = runs.finish(conf, again, "completed")
print(json.dumps({"record": rec["mlflow"], "again": again["mlflow"], "warning": warning,
                  "imported": sorted(m for m in sys.modules if m.split(".")[0] == "mlflow")}))
"""


def test_the_driver_opens_reopens_and_closes_an_mlflow_run_without_importing_mlflow(mlflow_server, tmp_path):
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    sweep = str(tmp_path / "sweep")
    r = subprocess.run([sys.executable, "-c", _DRIVER_SIDE, mlflow_server, sweep], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["imported"] == [] and out["warning"] is None
    rec = out["record"]
    assert out["again"]["run_id"] == rec["run_id"] and rec["parent_run_id"]
    client = MlflowClient(mlflow_server)
    run = client.get_run(rec["run_id"])
    assert run.info.status == "FINISHED" and run.info.end_time is not None
    assert run.info.run_name == "0_job" and run.info.experiment_id == rec["experiment_id"]
    assert client.get_experiment(rec["experiment_id"]).name == "driver-rest"
    assert run.data.params["train.lr"] == "0.1" and run.data.params["plan.global_batch"] == "16"
    assert run.data.tags["continued.train.lr"] == "0.2"  # a parameter cannot change: the new value as a tag
    assert run.data.tags["mlflow.parentRunId"] == rec["parent_run_id"]
    parent = client.get_run(rec["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags[tracking.TAG_SWEEP] == sweep
