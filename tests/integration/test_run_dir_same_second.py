"""Runs started in the same second get distinct run directories (runner/rundir/run_dir.py): drivers racing for one
name on a local disk, each claiming it with an atomic mkdir, the later ones taking the next free suffix. (Through
two real drivers this collided only when both happened to start within the same second, and skipped otherwise;
here every claim is for the same second. The object-store claim: tests/integration/test_lease.py.)"""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path

from ddp_runner.rundir import run_dir


def test_runs_in_the_same_second_get_distinct_dirs(tmp_path: Path) -> None:
    now, root, n = datetime(2026, 1, 2, 3, 4, 5), tmp_path / "outputs", 4
    start = threading.Barrier(n)
    made: list = []

    def claim() -> None:
        start.wait()  # all at once: every claimant races for the same first name
        made.append(run_dir.create_run_dir(str(root), "smoke", 1, now))

    threads = [threading.Thread(target=claim) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = sorted(Path(rd.path).name for rd in made)
    assert names == ["03-04-05_smoke_w1", "03-04-05_smoke_w1_1", "03-04-05_smoke_w1_2", "03-04-05_smoke_w1_3"]
    assert {Path(rd.path).parent for rd in made} == {root / "2026-01-02"}
    for rd in made:
        assert all((Path(rd.path) / sub).is_dir() for sub in ("logs", "tb", "checkpoints"))
        rd.lease.release()
