"""A page that shows ``ddp-compare … --out DIR`` and then says what it writes names the files where they are:
``DIR/report.md``, not ``report.md`` (ddp-compare writes into the folder ``--out`` names)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.doc_commands import pages

_BLOCK_THEN_PROSE = re.compile(r"^```bash\n(.*?)^```\n\n(.*?)(?:\n\n|\Z)", re.M | re.S)
_WRITTEN = re.compile(r"`([\w./-]*report\.(?:md|csv))`")


def said_written(text: str) -> list[tuple[str, str]]:
    """(the --out folder, a report file the paragraph after the command's block names) for each such pair."""
    found = []
    for block, prose in _BLOCK_THEN_PROSE.findall(text):
        outs = re.findall(r"^ddp-compare .*--out (\S+)", block, re.M)
        if len(outs) == 1 and "writes" in prose:
            found += [(outs[0], name) for name in _WRITTEN.findall(prose.split("writes", 1)[1])]
    return found


def test_the_check_sees_a_bare_name() -> None:
    text = "```bash\nddp-compare runs --out report\n```\n\nwrites `report.md` and `report/report.csv`.\n"
    assert said_written(text) == [("report", "report.md"), ("report", "report/report.csv")]


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_the_report_files_are_named_under_the_out_folder(page: Path) -> None:
    for out, name in said_written(page.read_text()):
        assert name.startswith(f"{out}/"), f"{page.name}: `--out {out}` writes {out}/{Path(name).name}, not {name}"
