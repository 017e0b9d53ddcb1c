"""End-to-end: real torchrun, real gloo process groups, real TensorBoard files, through the CLI."""

from __future__ import annotations

import time

from tests.support.run_tree import load_json


def test_error_record_keeps_the_time_of_failure_not_of_writing(tmp_path):
    # A failing rank tears its process group down before its error is written; a peer's collective fails at
    # once, so the failing rank's record must carry the earlier time or the wrong rank is named.
    from ddp_runner.tasks.engine import worker_io

    (tmp_path / "logs").mkdir()
    exc = RuntimeError("boom")
    worker_io.mark_failure_time(exc)
    failed_at = time.time()
    time.sleep(0.05)
    worker_io.mark_failure_time(exc)  # a second stamp (an outer handler) keeps the first
    worker_io.record_error(str(tmp_path), 1, exc)
    record = load_json(tmp_path / "logs" / "rank1.error.json")
    assert record["time"] <= failed_at and record["type"] == "RuntimeError"
