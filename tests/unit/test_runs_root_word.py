"""Issue 45 item 7: ``ddp-runs output.root=/x`` lists the runs under /x, as ``ddp-run output.root=/x`` wrote them
(it used to look for a folder literally named ``output.root=/x``); another ``key=value`` is told that ddp-runs wants
an output root (a path or URL)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_runner.report import runs


def test_root_word_takes_a_path_a_url_or_the_output_root_key():
    assert runs.root_word("/data/outputs") == "/data/outputs"
    assert runs.root_word("s3://bucket/a=b") == "s3://bucket/a=b"  # a URL with an = in it is a URL
    assert runs.root_word("output.root=/data/outputs") == "/data/outputs"
    assert runs.root_word("output.root=s3://bucket/out") == "s3://bucket/out"
    assert runs.root_word("output.root=/x", exists=lambda p: p == "output.root=/x") == "output.root=/x"  # real folder
    for word in ("task=gpt", "output.root="):
        with pytest.raises(ValueError, match="takes an output root"):
            runs.root_word(word)


def test_ddp_runs_accepts_the_key_form(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    root = tmp_path / "outputs"
    root.mkdir()
    assert runs.main([f"output.root={root}"]) == 0  # was: 2, "output.root=…: no such directory"
    assert capsys.readouterr().out.strip() == f"ddp-runs: no runs under {root}"


@pytest.mark.parametrize("argv, says", [(["task=gpt"], "ddp-runs takes an output root (a path or URL, or"
                                         " output.root=<root>), not task=gpt"),
                                        (["show", "output.root=/x"], "'show' takes a run directory (a path or URL),"
                                         " not output.root=/x")])
def test_another_key_is_told_what_ddp_runs_wants(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]):
    assert runs.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ddp-runs: error: {says}. Fix: ") and "no such directory" not in err
