"""Issue 45 item 4: every interpolation of the composed config that cannot be resolved is a refusal naming the key,
the text as given and the fix (runner/config/interpolation.py), never OmegaConf's traceback."""

from __future__ import annotations

import pytest
from hydra.core.utils import setup_globals
from omegaconf import OmegaConf

from ddp_runner.config.interpolation import raw_value, resolved
from ddp_runner.contract.errors import PlanError


@pytest.mark.parametrize("value, problem, fix", [
    ("${now:}", "its interpolation cannot be resolved (TypeError", "give the value itself"),
    ("${oc.env:NOPE_X}", "environment variable NOPE_X, which is not set", "${oc.env:NOPE_X,<default>}"),
    ("${nope.x}", "refers to nope.x, which is no key of the config", "interpolate a key that exists"),
    ("${foo:bar}", "resolver named 'foo', which does not exist", "oc.env"),
])
def test_a_failing_interpolation_is_a_refusal_naming_the_key(value: str, problem: str, fix: str,
                                                             monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("NOPE_X", raising=False)
    setup_globals()  # Hydra's own resolvers (now), registered as a ddp-run composes
    cfg = OmegaConf.create({"train": {"lr": value, "epochs": 2}, "seed": 7})
    with pytest.raises(PlanError) as exc:
        resolved(cfg)
    assert (exc.value.key, exc.value.value) == ("train.lr", value)
    assert problem in exc.value.problem and fix in exc.value.fix


def test_one_in_a_list_names_its_index_and_a_good_config_resolves(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("NOPE_Y", raising=False)
    monkeypatch.setenv("SOME_LR", "0.01")
    with pytest.raises(PlanError) as exc:
        resolved(OmegaConf.create({"train": {"betas": [0.9, "${oc.env:NOPE_Y}"]}}))
    assert (exc.value.key, exc.value.value) == ("train.betas[1]", "${oc.env:NOPE_Y}")
    assert resolved(OmegaConf.create({"train": {"lr": "${oc.env:SOME_LR}", "e": "${train.lr}"}})) == {
        "train": {"lr": "0.01", "e": "0.01"}}


def test_raw_value_walks_dotted_keys_and_indices():
    tree = {"a": {"b": [1, {"c": "${x}"}]}}
    assert raw_value(tree, "a.b[1].c") == "${x}" and raw_value(tree, "a.b[0]") == 1
    assert raw_value(tree, "a.nope") == "a.nope"


def test_with_a_refusal_handler_the_process_exits_with_its_code(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("NOPE_X", raising=False)
    seen: list[PlanError] = []
    with pytest.raises(SystemExit) as exc:
        resolved(OmegaConf.create({"seed": "${oc.env:NOPE_X}"}), on_refusal=lambda err: seen.append(err) or 2)
    assert exc.value.code == 2 and [e.key for e in seen] == ["seed"]
