"""Trackers end to end against real parts: a real MLflow tracking server on loopback (SQLite backend, started once
per session, tests/support/mlflow_server.py) queried over its REST API, W&B's offline files read back as W&B's own
records, the CSV parsed, and ddp-export's Hugging Face folder loaded by transformers on the CPU.

Three launches of tiny GPTs share the session: one 2-rank run with every logger at once (read by most tests here,
made once per session whichever xdist worker asks first), a 2-job sweep (two children show one parent as well as
three did, at one job's launch less), and a run killed after step 4 then continued in place. Each uses an
experiment of its own on the one server, so the tests need not share a worker.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from ddp_runner.tasks.engine.diagnostics import faults
from tests.support.driver import ddp_run
from tests.support.mlflow_server import MlflowRest
from tests.support.run_tree import load_json, run_dirs
from tests.support.shared_runs import shared_run
from tests.support.waiting import wait_for
from tests.support.wandb_offline import read_run

TINY = ["task=gpt", "task.model.layers=1", "device=cpu", "batch.per_rank=4", "train.val_samples=8",
        "checkpoint.async_save=false"]
STEPS = 4


@pytest.fixture(scope="module")
def rest(mlflow_server: str) -> MlflowRest:
    return MlflowRest(mlflow_server)


@pytest.fixture(scope="session")
def tracked_run(tmp_path_factory, text_file, mlflow_server) -> Path:
    """2 gloo ranks, 4 steps, validation at 2 and 4, every logger at once (``logger=a,b`` read as a list); one run
    for the session, made by the first worker that asks (tests only read it)."""
    def make(root: Path) -> Path:
        r = ddp_run([*TINY, "world_size=2", f"data.path={text_file}", f"train.max_steps={STEPS}", "train.val_every=2",
                     "logger=tensorboard,csv,mlflow,wandb", f"logger.mlflow.tracking_uri={mlflow_server}",
                     "logger.mlflow.experiment=two-ranks"], root)
        assert r.returncode == 0, r.stdout + r.stderr
        [run] = run_dirs(root)
        return run

    return shared_run(tmp_path_factory, "tracked", make)


def _steps(rest: MlflowRest, run_id: str, key: str) -> list[int]:
    return sorted(int(p["step"]) for p in rest.history(run_id, key))


def _json(path: Path) -> dict:
    """A JSON record that may not be there yet, or may be being replaced: {} then."""
    try:
        return load_json(path)
    except (OSError, ValueError):
        return {}


def test_two_ranks_make_one_mlflow_run_with_the_config_plan_and_one_point_per_step(tracked_run, rest):
    runs = rest.runs(rest.experiment_id("two-ranks"))
    assert len(runs) == 1, "one tracker run per job, whatever the world size"
    [run] = runs
    info, params, tags = run["info"], rest.params(run), rest.tags(run)
    manifest = load_json(tracked_run / "run.json")
    assert manifest["trackers"]["mlflow"]["run_id"] == info["run_id"]
    assert info["status"] == "FINISHED" and tags["ddp_runner.run_dir"] == str(tracked_run)
    # The plan (global batch and how it is made) and the resolved config, as parameters.
    assert params["plan.global_batch"] == "8" and params["plan.world_size"] == "2"
    assert params["plan.explanation"] == "global batch 8 = 4 per rank × 2 ranks × 1 accumulation"
    assert params["task.model.layers"] == "1" and params["train.max_steps"] == str(STEPS)
    assert params["train.betas"] == "[0.9, 0.95]"  # lists as JSON
    # One point per logged step; every rank's step-time breakdown reached rank 0 (the log step's gather).
    assert _steps(rest, info["run_id"], "train/loss") == list(range(1, STEPS + 1))
    assert _steps(rest, info["run_id"], "val/loss") == [2, 4]
    for rank in (0, 1):
        assert _steps(rest, info["run_id"], f"time/rank{rank}/step_ms"), f"rank {rank}'s step times"
    summary = load_json(tracked_run / "summary.json")
    assert summary["trackers"] == {"ok": ["tensorboard", "csv", "mlflow", "wandb"], "failed": {}}
    mlflow_loss = {int(p["step"]): p["value"] for p in rest.history(info["run_id"], "train/loss")}
    assert [mlflow_loss[s] for s in range(1, STEPS + 1)] == pytest.approx(summary["losses"])


def test_wandb_offline_files_hold_the_run_its_config_and_every_step(tracked_run):
    recorded = load_json(tracked_run / "run.json")["trackers"]["wandb"]
    assert recorded["mode"] == "offline"
    w = read_run(tracked_run)
    assert [r["id"] for r in w["runs"]] == [recorded["id"]] and w["runs"][0]["project"] == "ddp-runner"
    assert str(w["config"]["plan.global_batch"]) == "8" and str(w["config"]["train.max_steps"]) == str(STEPS)
    steps = [h["_step"] for h in w["history"] if "train/loss" in h]
    assert steps == list(range(1, STEPS + 1))
    losses = [h["train/loss"] for h in w["history"] if "train/loss" in h]
    assert losses == pytest.approx(load_json(tracked_run / "summary.json")["losses"])


def test_csv_has_one_row_per_step_with_validation_in_the_same_row(tracked_run):
    with open(tracked_run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert [r["val/loss"] != "" for r in rows] == [False, True, False, True]
    assert [float(r["train/loss"]) for r in rows] == pytest.approx(load_json(tracked_run / "summary.json")["losses"])
    assert {"time/rank0/step_ms", "time/rank1/step_ms", "perf/tokens_per_s"} <= set(rows[0])


def test_export_loads_in_plain_pytorch_and_as_gpt2_in_transformers_with_the_same_logits(tracked_run, tmp_path):
    """ddp-export of the 2-rank run: model.safetensors into our GPT (strict), the hf folder into transformers'
    GPT2LMHeadModel; logits on one batch agree within 1e-5 (fp32 on CPU; seen: ~2e-7)."""
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel

    from ddp_runner.tasks import export as cli
    from ddp_runner.tasks.gpt.model import GPT

    cli.main([str(tracked_run), "--out", str(tmp_path / "st")])
    cli.main([str(tracked_run), "--format", "hf", "--out", str(tmp_path / "hf")])
    info = json.loads((tmp_path / "st" / "export.json").read_text())
    assert info["task"] == "gpt" and info["step"] == STEPS
    assert info["loss"] == pytest.approx(load_json(tracked_run / "summary.json")["losses"][-1])
    m = info["model"]
    ours = GPT(vocab=m["vocab"], context=m["context"], width=m["width"], layers=m["layers"], heads=m["heads"])
    ours.load_state_dict(load_file(tmp_path / "st" / "model.safetensors"))
    ours.eval()
    theirs = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    x = torch.randint(0, m["vocab"], (2, m["context"]), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours(x), theirs(x).logits
    assert a.shape == b.shape
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_sweep_jobs_are_children_of_one_parent_run(tmp_path, text_file, mlflow_server, rest):
    r = ddp_run(["-m", *TINY, "world_size=1", f"data.path={text_file}", "train.max_steps=2", "train.val_every=0",
                 "checkpoint.final=false", "train.lr=0.001,0.002", "logger=[mlflow]",
                 f"logger.mlflow.tracking_uri={mlflow_server}", "logger.mlflow.experiment=sweep"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = rest.runs(rest.experiment_id("sweep"))
    parents = [x for x in runs if "ddp_runner.sweep_dir" in rest.tags(x)]
    children = [x for x in runs if x not in parents]
    assert len(parents) == 1 and len(children) == 2, "one run per job, and one parent for the sweep"
    parent_id = parents[0]["info"]["run_id"]
    assert all(rest.tags(c)["mlflow.parentRunId"] == parent_id for c in children)
    assert sorted(rest.params(c)["train.lr"] for c in children) == ["0.001", "0.002"]
    for c in children:
        assert _steps(rest, c["info"]["run_id"], "train/loss") == [1, 2]
    jobs = run_dirs(tmp_path)
    assert len(jobs) == 2
    assert {load_json(j / "run.json")["trackers"]["mlflow"]["parent_run_id"] for j in jobs} == {parent_id}
    assert parents[0]["info"]["status"] == "FINISHED"


def test_killed_then_resumed_run_continues_its_tracker_run_without_duplicate_points(tmp_path, text_file,
                                                                                  mlflow_server, rest):
    """Killed after step 4, once step 3's point is on the server (the fault's gate, opened when the test sees it
    there; step 4's point would be sent after the fault), the last checkpoint at step 2: the continued run logs
    steps 3-6 into the same MLflow run, step 3 once. Every checkpoint also exported its weights
    (checkpoint.export=safetensors)."""
    args = [*TINY, "world_size=1", f"data.path={text_file}", "train.max_steps=6", "train.val_every=0",
            "checkpoint.every_steps=2", "checkpoint.export=safetensors", "logger=[mlflow,csv]",
            f"logger.mlflow.tracking_uri={mlflow_server}",
            "logger.mlflow.experiment=resumed", "fault.kind=sigkill", "fault.rank=0", "fault.step=4"]
    gate = tmp_path / "gate"
    driver = subprocess.Popen([sys.executable, "-m", "ddp_runner", *args, f"output.root={tmp_path}"],
                              cwd=tempfile.gettempdir(), env={**os.environ, faults.ENV_FAULT_GATE: str(gate)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        [run] = wait_for("the run directory", lambda: run_dirs(tmp_path), driver=driver)
        run_id = wait_for("the MLflow run", lambda: (_json(run / "run.json").get("trackers") or {}).get(
            "mlflow", {}).get("run_id"), driver=driver)
        wait_for("step 3's point on the server", lambda: 3 in _steps(rest, run_id, "train/loss"), driver=driver)
        gate.touch()
        out, err = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode != 0, out + err
    [killed] = rest.runs(rest.experiment_id("resumed"))
    assert killed["info"]["status"] == "FAILED"
    before = _steps(rest, run_id, "train/loss")
    assert before == [1, 2, 3], "the killed attempt logged a step past its last checkpoint (step 2)"

    r = ddp_run([f"resume={run}"], tmp_path / "unused")
    assert r.returncode == 0, r.stdout + r.stderr
    [resumed] = rest.runs(rest.experiment_id("resumed"))
    assert resumed["info"]["run_id"] == run_id == load_json(run / "run.json")["trackers"]["mlflow"]["run_id"]
    assert resumed["info"]["status"] == "FINISHED"
    assert _steps(rest, run_id, "train/loss") == [1, 2, 3, 4, 5, 6], "one point per step, none twice"
    with open(run / "metrics.csv", newline="") as f:
        assert [int(row["step"]) for row in csv.DictReader(f)] == [1, 2, 3, 4, 5, 6]

    from safetensors.torch import load_file

    from ddp_runner.tasks.engine import checkpoint as ck

    assert sorted(p.name for p in (run / "export").iterdir()) == ["step_2", "step_4", "step_6"]
    for step in (2, 4, 6):
        assert json.loads((run / "export" / f"step_{step}" / "export.json").read_text())["step"] == step
    final = ck.load(ck.latest(f"{run}/checkpoints"))["model"]
    exported = load_file(run / "export" / "step_6" / "model.safetensors")
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)
