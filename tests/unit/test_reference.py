"""The config reference (``ddp-run --help``, docs/config.md) is made from the validation table and covers it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_runner.config import reference
from ddp_runner.config.cli_help import conf_dirs, info_args
from ddp_runner.config.key_docs import KEY_DOCS
from ddp_runner.contract.rules import choice, flag, integer, number, text

CONF = Path(__file__).resolve().parents[2] / "conf"


def test_every_key_of_the_table_has_one_line_and_no_line_names_a_key_it_lacks() -> None:
    keys = [r.key for r in reference.table_rules()]
    assert len(keys) == len(set(keys))
    assert set(keys) - set(KEY_DOCS) == set(), "a key of the validation table has no line in key_docs.py"
    assert set(KEY_DOCS) - set(keys) == set(), "key_docs.py describes a key the validation table no longer has"
    assert all(line.strip() for line in KEY_DOCS.values())


@pytest.mark.parametrize("rule, kind, allowed", [
    (integer("world_size", lo=1, also=("auto",)), "int", ">= 1, or auto"),
    (integer("train.max_steps", lo=1, null=True), "int", ">= 1, or null"),
    (number("train.lr", lo=0, lo_open=True), "float", "> 0"),
    (number("train.min_lr_ratio", lo=0, hi=1), "float", ">= 0 and <= 1"),
    (choice("device", ("auto", "cpu", "cuda")), "choice", "auto, cpu, cuda"),
    (choice("train.compile_mode", ("default", "max-autotune"), null=True), "choice", "default, max-autotune, or null"),
    (flag("train.compile"), "bool", "true, false"),
    (text("resume"), "string", "non-empty text"),
])
def test_type_and_allowed_values_come_from_the_rule(rule, kind: str, allowed: str) -> None:
    assert (reference.kind(rule), reference.allowed(rule)) == (kind, allowed)


def test_a_list_rule_says_its_length_and_bounds() -> None:
    betas = next(r for r in reference.table_rules() if r.key == "train.betas")
    assert reference.allowed(betas) == "2 numbers, each >= 0 and < 1"


def test_help_lists_every_key_with_its_type_allowed_values_and_line() -> None:
    out = reference.help_text(conf_dirs(None, str(CONF)), {})
    for rule in reference.table_rules():
        assert f"  {rule.key}\n      {reference.kind(rule)}: {reference.allowed(rule)}. {KEY_DOCS[rule.key]}" in out


def test_help_shows_the_composed_value_and_the_keys_outside_the_table() -> None:
    out = reference.help_text([CONF], {"batch.per_rank": 16, "train.betas": [0.9, 0.95], "fault.kind": None})
    assert "  batch.per_rank = 16\n" in out and "  train.betas = [0.9, 0.95]\n" in out
    assert "Other keys of this config" in out and "  fault.kind = null" in out


def test_the_first_sentence_of_a_preset_comment_is_its_line() -> None:
    yaml = ("# @package _global_\n# A tiny GPT (2 layers, ~0.1M params) on the text corpus: trains in\n"
            "# seconds on CPU. The same task scales to GPT-2.\ndefaults:\n  - override /data: text\n")
    assert reference.first_sentence(yaml) == ("A tiny GPT (2 layers, ~0.1M params) on the text corpus: trains in "
                                              "seconds on CPU.")
    assert reference.first_sentence("name: x\n") == ""


def test_every_preset_of_the_package_has_a_line() -> None:
    found = reference.presets([CONF])
    assert set(found) == set(reference.GROUPS)
    for group, options in found.items():
        on_disk = {p.stem for p in (CONF / group).glob("*.yaml")}
        assert set(options) == on_disk
        assert all(line and line != "(no description)" for line in options.values()), (group, options)


def test_a_users_preset_comes_first_and_joins_the_list(tmp_path: Path) -> None:
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "mytask.yaml").write_text("# My classifier on my images.\ntask:\n  name: mytask\n")
    found = reference.presets([tmp_path, CONF])
    assert found["task"]["mytask"] == "My classifier on my images."
    assert "smoke" in found["task"]


@pytest.mark.parametrize("args, expected", [
    (["--info"], ["--info", "all"]),
    (["--info", "task=gpt"], ["--info", "all", "task=gpt"]),
    (["-i", "defaults", "task=gpt"], ["-i", "defaults", "task=gpt"]),
    (["task=gpt"], ["task=gpt"]),
])
def test_info_without_a_choice_gets_all(args: list[str], expected: list[str]) -> None:
    assert info_args(args) == expected
