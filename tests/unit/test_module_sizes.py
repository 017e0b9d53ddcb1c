"""The house's size rules (issue 50): the training loop reads in one sitting, and no module needs two screens of
contents. A module that outgrows them is split by job, not squeezed."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOOP_MAX, MODULE_MAX = 300, 450


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_training_loop_stays_within_300_lines():
    assert lines(ROOT / "tasks/engine/trainer.py") <= LOOP_MAX


def test_no_module_of_the_driver_or_the_workers_is_over_450_lines():
    big = {str(p.relative_to(ROOT)): n for folder in ("runner", "tasks") for p in (ROOT / folder).rglob("*.py")
           if (n := lines(p)) > MODULE_MAX}
    assert not big, big
