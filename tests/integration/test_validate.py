"""Refusal before launch is the rule: every key the engine or a task reads is checked by the driver.

The property tests draw configs that mix valid and invalid values for many keys at once and hold the driver to
its contract both ways: whatever it refuses names a key it was given wrong (exit 2, no run directory), and
whatever it accepts builds and trains in the engine (the real Trainer, in a one-process gloo group) without
failing for a config reason. A few accepted edge configs also run end to end through torchrun.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ddp_runner.config.validate import ENGINE_RULES
from ddp_runner.contract.errors import PlanError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "image_classifier"
INF, NAN = math.inf, math.nan

# Per key: values the driver must accept (and the workers then run), and values it must refuse even alone.
POOL: dict[str, tuple[list[Any], list[Any]]] = {
    "world_size": ([1, 2], [0, -1, "auto", 2.0]),
    "batch.per_rank": ([1, 4], [0, -3, 2.5, "8", None]),
    "batch.accumulation": ([1, 2], [0, 1000]),
    "batch.global": ([None, 16], [30, 0]),
    "seed": ([0, 7, 2**31], [-1, 2**40, 1.5, None, True]),
    "train.max_steps": ([None, 1, 3], [0, -2, 2.5]),
    "train.epochs": ([1, 2], [0, 1.5]),
    "train.optimizer": (["sgd", "adamw"], ["lamb", None]),
    "train.lr": ([1e-3, 0.5, 1], [0, -0.1, "fast", INF, NAN, None]),
    "train.weight_decay": ([0.0, 0.1], [-0.01, None]),
    "train.betas": ([[0.9, 0.95], [0.0, 0.5]], [[1.0, 0.9], [0.9], "x", [-0.1, 0.9]]),
    "train.momentum": ([0.0, 0.9], [1.0, -0.5]),
    "train.grad_clip": ([None, 1.0, 0.01], [0.0, -1.0, "none"]),
    "train.schedule": (["constant", "cosine"], ["linear"]),
    "train.warmup_steps": ([0, 2, 1000], [-1]),
    "train.min_lr_ratio": ([0.0, 0.1, 1.0], [1.5, -0.1]),
    "train.precision": (["fp32", "bf16"], ["fp8", None]),
    "train.compile": ([False], ["yes", 1]),
    "train.compile_mode": ([None], ["max-autotune", "turbo"]),
    "train.log_every": ([1, 3], [0, -1]),
    "train.val_every": ([0, 1], [-1]),
    "train.val_samples": ([None, 4], [0]),
    "train.num_workers": ([0], [-1, "two"]),
    "train.profile.steps": ([0], [-1]),
    "train.profile.start": ([0, 10], [-1]),
    "train.ddp_bucket_mb": ([25, 0.5, None], [0, -1]),
    "train.ddp_comm": (["fp32", None], ["bf16", "fp8"]),
    "train.gpu_telemetry": ([True, False], ["maybe"]),
    "checkpoint.every_steps": ([0, 1, 2], [-1]),
    "checkpoint.keep_last": ([0, 1, 2], [-1]),
    "checkpoint.async_save": ([True, False], ["no"]),
    "timeout_s": ([600, 60], [0, -5, "x"]),
    "output.private": ([False, True], ["yes"]),
    "launcher.max_restarts": ([0, 1], [-1]),
}
TASK_POOL: dict[str, dict[str, tuple[list[Any], list[Any]]]] = {
    "smoke": {"data.num_samples": ([64, 16], [3, 0, -1]), "data.seed": ([7, 0], [-1]),
              "task.in_features": ([8, 1], [0, -2, 1.5]), "task.out_features": ([1, 3], [0])},
    "gpt": {"task.model.heads": ([1, 2], [3, 0]), "task.model.width": ([16, 24], [0, 7]),
            "task.model.layers": ([1, 2], [0]), "task.model.context": ([8, 16], [0, 100000]),
            "task.model.vocab": ([256, 300], [100, 0]), "task.model.dropout": ([0.0, 0.1], [1.0, -0.1]),
            "task.model.attention": (["auto", None], ["fast"]), "task.model.loss": (["fused", "plain"], ["chunky"]),
            "data.val_fraction": ([0.1, 0.0, 0.5], [1.0, -0.1]), "data.format": (["auto", "bytes"], ["int8"]),
            "data.vocab": ([None, 256], [100000, 0])},
    "tiny_cnn": {"task.classes": ([4, 1], [0]), "task.image_size": ([16, 2], [1, 0]), "task.width": ([4, 1], [0]),
                 "task.dropout": ([0.1, 0.0], [1.0]), "task.val_samples": ([16, 1], [0]),
                 "data.num_samples": ([64, 8], [0, 3])},
}


def _pool(task: str) -> dict[str, tuple[list[Any], list[Any]]]:
    return {**POOL, **TASK_POOL[task]}


# A key whose value breaks a rule that joins it to these may be the one named.
RELATED = {
    "train.compile": {"train.compile_mode"},
    "device": {"backend", "train.ddp_comm"}, "backend": {"train.ddp_comm"},
    "world_size": {"batch.global", "batch.per_rank", "batch.accumulation", "data.path", "task.train_samples"},
    "batch.per_rank": {"batch.global", "batch.accumulation", "data.path", "task.train_samples"},
    "data.num_samples": {"batch.per_rank", "batch.accumulation", "batch.global", "task.train_samples"},
    "task.model.context": {"data.path", "batch.per_rank", "batch.accumulation", "batch.global"},
    "data.val_fraction": {"data.path", "batch.per_rank", "batch.accumulation", "batch.global"},
    "task.model.heads": {"task.model.width"},
    "data.format": {"task.model.vocab", "data.path"},
    "data.vocab": {"task.model.vocab"},
}


def _set(cfg: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        cfg = cfg.setdefault(p, {})
    cfg[leaf] = value


def _compose(overrides: list[str]) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, dict[str, Any]]:
    """A composed config per task, small enough to train in a moment on CPU."""
    text = tmp_path_factory.mktemp("data") / "tiny.txt"
    text.write_bytes(bytes(range(32, 127)) * 40)  # 3800 byte tokens
    common = ["device=cpu", "world_size=2", "train.max_steps=3", "checkpoint.every_steps=0"]
    return {
        "smoke": _compose([*common]),
        "gpt": _compose([*common, "task=gpt", f"data.path={text}", "task.model.width=16", "task.model.heads=2",
                         "task.model.context=16", "train.warmup_steps=1", "train.val_samples=8", "batch.per_rank=4"]),
        "tiny_cnn": _compose([*common, f"hydra.searchpath=[file://{EXAMPLE / 'conf'}]", "task=tiny_cnn",
                              "task.width=4", "data.num_samples=64", "task.val_samples=16", "batch.per_rank=4"]),
    }


def _driver_plan(cfg: dict[str, Any]) -> Any:
    """What the driver does before it creates anything (runner/job/planning.py), in this process."""
    from ddp_runner.job import planning

    sys.path.append(str(EXAMPLE)) if str(EXAMPLE) not in sys.path else None
    plan, task_dir, probe = planning.plan_job(cfg, [str(EXAMPLE)])
    if probe is not None:  # torch's answers were needed only for the plan
        probe.cancel()
    return plan, task_dir


@st.composite
def configs(draw, task: str | None = None) -> tuple[str, dict[str, Any]]:
    """(task, {key: value}): 0-8 keys set to values the driver must accept, and at most one to a value that it
    must refuse, so that every refusal has one right answer and every acceptance a varied config to run."""
    task = task or draw(st.sampled_from(sorted(TASK_POOL)))
    pool = _pool(task)
    keys = draw(st.lists(st.sampled_from(sorted(pool)), max_size=8, unique=True))
    changed = {k: draw(st.sampled_from(pool[k][0])) for k in keys}
    if draw(st.booleans()):
        bad = draw(st.sampled_from(sorted(k for k in pool if pool[k][1])))
        changed[bad] = draw(st.sampled_from(pool[bad][1]))
    return task, changed


def _named_key_is_one_given(err: PlanError, changed: dict[str, Any]) -> bool:
    allowed = set(changed) | {r for k in changed for r in RELATED.get(k, ())}
    return err.key in allowed


# -- in process: refusals name a key given wrong; acceptances train ------------------------------------------


def _train_briefly(cfg: dict[str, Any], run_dir: Path) -> None:
    """Build the task's parts, DDP, optimizer, scheduler, loader, TensorBoard writer and checkpointer from an
    accepted config, as rank 0 does, and train up to 2 optimizer steps (validating, checkpointing) on CPU.

    One rank (this process's one-process group): the plan's world size only splits the data, which the driver's
    own arithmetic (runner/config/plan.py) covers; the end-to-end runs below use two ranks."""
    from concurrent.futures import Future

    import torch

    from ddp_runner.tasks.engine.config import Config
    from ddp_runner.tasks.engine.rank import Context
    from ddp_runner.tasks.engine.trackers.open import open_trackers
    from ddp_runner.tasks.engine.trainer import Trainer

    cfg = copy.deepcopy(cfg)
    t = cfg["train"]
    t["max_steps"] = min(t["max_steps"] or 2, 2)  # the accepted values, only fewer steps of them
    t["num_workers"] = 0  # DataLoader worker processes are DataLoader's own business, and slow here
    t["val_samples"] = min(t["val_samples"] or 8, 8)
    ctx = Context(0, 0, 1, torch.device("cpu"), str(run_dir), str(run_dir), None)
    writer: Future = Future()
    writer.set_result(open_trackers(Config(cfg), str(run_dir), str(run_dir)))  # the config's loggers, as rank 0
    trainer = Trainer(Config(cfg), ctx, writer)
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    assert summary["steps"] >= 1 and all(math.isfinite(x) for x in summary["losses"] if x is not None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(drawn=configs())
def test_refusals_name_a_key_given_wrong_and_acceptances_train(drawn, bases, gloo_group, tmp_path):
    task, changed = drawn
    cfg = copy.deepcopy(bases[task])
    for k, v in changed.items():
        _set(cfg, k, v)
    try:
        plan, _ = _driver_plan(cfg)
    except PlanError as err:
        event(f"refused ({task})")
        assert _named_key_is_one_given(err, changed), (err, changed)
        assert err.key in str(err) and err.fix
        return
    event(f"accepted ({task})")
    _train_briefly(cfg, Path(tempfile.mkdtemp(dir=tmp_path)))


@pytest.mark.parametrize("task, key, value", [(t, k, v) for t in sorted(TASK_POOL) for k, (_, bad) in
                                                sorted(_pool(t).items()) for v in bad])
def test_each_wrong_value_alone_is_refused_naming_its_key(task, key, value, bases):
    """Guards against a rule missing from the table (the value would be launched and fail in the workers)."""
    cfg = copy.deepcopy(bases[task])
    _set(cfg, key, value)
    with pytest.raises(PlanError) as e:
        _driver_plan(cfg)
    assert e.value.key in {key} | RELATED.get(key, set()), e.value
    assert e.value.key in str(e.value) and e.value.fix


# -- through the CLI's main(): exit 2 and nothing on disk, or a dry run ------------------------------------------


def _override(key: str, value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    if isinstance(value, float) and not math.isfinite(value):
        text = str(value)
    return f"{key}={text}"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(drawn=configs(task="smoke"))
def test_the_cli_refuses_with_exit_2_and_nothing_on_disk_or_accepts(drawn, tmp_path, cli):
    """Through the CLI's main() in this process (tests/e2e/test_cli.py proves exit 2 of a real process)."""
    _task, changed = drawn
    root = tmp_path / f"out{abs(hash(json.dumps(changed, default=str)))}"
    r = cli(["device=cpu", "dry_run=true", *(_override(k, v) for k, v in changed.items())], root)
    assert not root.exists(), "neither a refusal nor a dry run leaves anything on disk"
    if r.returncode == 2:
        key = r.stderr.split("key:", 1)[1].split()[0]
        assert key in set(changed) | {x for k in changed for x in RELATED.get(k, ())}, (r.stderr, changed)
        assert "fix:" in r.stderr
    else:
        assert r.returncode == 0, r.stderr
        assert "dry run, nothing launched" in r.stdout


# -- the table itself --------------------------------------------------------------------------------------


def test_every_key_of_the_default_config_the_engine_reads_has_a_rule():
    from ddp_runner.contract.rules import flatten

    keys = set(flatten(_compose(["device=cpu"])))
    ruled = {r.key for r in ENGINE_RULES}
    # Keys with rules elsewhere: the data group (runner/data/prep.py, DATA_RULES), the task's (its checks hook),
    # train.inductor's free-form settings (runner/config/plan.py).
    # fault.*, watchdog.*, debug: runner/diagnostics/setup.py; launcher.*: runner/config/plan.py and runner/launch/.
    unruled = {k for k in keys - ruled
               if not k.startswith(("data.", "task.", "train.inductor", "launcher.", "fault.", "watchdog.", "debug"))}
    assert not unruled, f"keys without a rule in runner/config/validate.py: {sorted(unruled)}"
