"""Test files have no __init__.py, so pytest names each module by its basename: two tiers' files of one name
collide at collection ("import file mismatch") in a whole-suite run, though each runs alone."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_basename():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1]
