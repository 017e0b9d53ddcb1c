"""Issue 51 item 4: every command the tools print runs as printed. The one builder (runner/contract/command_line.py)
quotes a value for Hydra's override grammar and the whole word for the shell: what Hydra and OmegaConf read back
from the printed word, split as a shell splits it, is the very value (a sweep job's ``0_gpt_w1_seed=1``, a
non-ASCII letter, quotes, backslashes, ``${``)."""

from __future__ import annotations

import shlex

from hydra.core.override_parser.overrides_parser import OverridesParser
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from ddp_runner.contract import command_line

PARSER = OverridesParser.create()
HARD = ["/runs/sweep/0_gpt_w1_seed=1", "/runs/ré/x", "a b", "1", "1e5", "true", "null", "nan", "", "a,b",
        "x${y}", "x\\${y}", 'a"b', "a\\", 'a\\"b', "a'b", "(x)", "[1]", "{a:1}", "~x", "gs://b/x", "a\\b", "$x"]


def read_back(word: str) -> object:
    """What ddp-run's config holds for the override ``word`` typed into a shell: the shell's split, Hydra's
    parse, OmegaConf's resolution."""
    [typed] = shlex.split(word)
    key, _, _ = typed.partition("=")
    value = PARSER.parse_override(typed).value()
    return OmegaConf.create({key: value})[key]


def check(value: str) -> None:
    word = shlex.quote(command_line.override("resume", value))
    assert read_back(word) == value, (value, word)
    assert shlex.split(command_line.resume(value)) == ["ddp-run", command_line.override("resume", value)]


def test_hard_values_read_back_as_given() -> None:
    for value in HARD:
        check(value)


def test_what_needs_no_quotes_gets_none() -> None:
    plain = "outputs/2026-01-01/12-00-00_gpt_w1"
    assert command_line.resume(plain) == f"ddp-run resume={plain}"
    assert command_line.resume("/r/0_gpt_w1_seed=1") == "ddp-run 'resume=\"/r/0_gpt_w1_seed=1\"'"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab1_-./:=,$ {}()[]\\\"'é~+e")), max_size=12))
def test_any_value_reads_back_as_given(value: str) -> None:
    check(value)
