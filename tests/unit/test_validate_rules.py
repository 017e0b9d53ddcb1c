"""Refusal before launch is the rule: every key the engine or a task reads is checked by the driver.

The property tests draw configs that mix valid and invalid values for many keys at once and hold the driver to
its contract both ways: whatever it refuses names a key it was given wrong (exit 2, no run directory), and
whatever it accepts builds and trains in the engine (the real Trainer, in a one-process gloo group) without
failing for a config reason. A few accepted edge configs also run end to end through torchrun.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from ddp_runner.config.validate import check_engine
from ddp_runner.contract.errors import PlanError
from ddp_runner.contract.rules import check_keys, integer, number

INF, NAN = math.inf, math.nan


def _set(cfg: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        cfg = cfg.setdefault(p, {})
    cfg[leaf] = value


@pytest.mark.parametrize("key, value, words", [
    ("train.lr", -0.1, "must be > 0"),
    ("train.lr", NAN, "finite"),
    ("train.betas", [0.9, 1.0], "< 1"),
    ("train.betas", [0.9], "list of 2"),
    ("train.grad_clip", 0, "> 0"),
    ("train.log_every", 0, ">= 1"),
    ("checkpoint.keep_last", -1, ">= 0"),
    ("checkpoint.every_steps", -1, ">= 0"),
    ("train.num_workers", -1, ">= 0"),
    ("timeout_s", 0, "> 0"),
    ("seed", 1.5, "whole number"),
    ("seed", True, "whole number"),
    ("train.compile_mode", "turbo", "unknown value"),
    ("train.precision", None, "null is not allowed"),
])
def test_a_bad_value_is_refused_with_its_key_value_and_fix(key, value, words):
    cfg: dict[str, Any] = {}
    _set(cfg, key, value)
    with pytest.raises(PlanError) as e:
        check_engine(cfg)
    assert e.value.key == key and words in e.value.problem and e.value.fix
    assert key in str(e.value)


def test_cross_key_rules():
    from ddp_runner.config.validate import warnings

    # A preset's warmup longer than a few benchmark steps is allowed (bench/gpt_bench.py runs gpt2_small so),
    # and said.
    check_engine({"train": {"max_steps": 10, "warmup_steps": 11}})
    assert "train.warmup_steps=11" in warnings({"train": {"max_steps": 10, "warmup_steps": 11}})[0]
    assert warnings({"train": {"max_steps": 10, "warmup_steps": 10}}) == []
    with pytest.raises(PlanError) as e:
        check_engine({"train": {"compile": False, "compile_mode": "max-autotune"}})
    assert e.value.key == "train.compile_mode"


def test_rules_say_their_bounds():
    with pytest.raises(PlanError) as e:
        check_keys({"a": 2}, [number("a", lo=0, hi=1, hi_open=True, example="0.5")])
    assert e.value.problem == "must be < 1 and >= 0" and e.value.fix == "e.g. a=0.5"
    check_keys({"a": "auto"}, [integer("a", lo=1, also=("auto",))])


def test_accumulation_longer_than_an_epoch_is_refused_before_launch():
    # 64 samples over 2 ranks = 32 per rank = 4 micro-batches of 8: accumulation 5 would never step.
    from ddp_runner.config.plan import make_plan
    from tests.unit.test_plan import cfg as plan_cfg

    with pytest.raises(PlanError) as e:
        make_plan(plan_cfg(batch__accumulation=5), [], train_samples=64)
    assert e.value.key == "batch.accumulation" and "4 micro-batches" in e.value.problem
    make_plan(plan_cfg(batch__accumulation=4), [], train_samples=64)
