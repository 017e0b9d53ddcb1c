"""Trackers and export in this process: refusals before launch (a tracker not installed names its extra; a tracker
that cannot be reached refuses, or with on_unreachable=warn is dropped), the Hugging Face folder with the tokenizer
ddp-tokenize made, and fsdp's DCP shards consolidated without a process group."""

from __future__ import annotations

import importlib.util
import json
import socket

import pytest
import torch

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
