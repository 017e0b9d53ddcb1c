"""Test files have no __init__.py, so pytest names each module by its basename: two tiers' files of one name
collide at collection ("import file mismatch") in a whole-suite run, though each runs alone."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_basename():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, c in names.items() if c > 1]


def test_tests_import_their_helpers_as_a_package():
    """Helpers live in tests/support and are imported as ``tests.support``: no test reaches into conftest.py or
    edits sys.path to find them (the checkout is on pytest's pythonpath)."""
    found = [f"{p.relative_to(TESTS)}:{n}" for p in TESTS.rglob("*.py") if p.name != "test_test_names.py"
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if "sys.path.insert(" in line or line.lstrip().startswith(("from conftest import", "import conftest"))]
    assert not found, found
