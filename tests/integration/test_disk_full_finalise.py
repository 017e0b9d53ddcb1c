"""Issue 51 item 8, a disk that fills after a resume: the failed run still ends ``failed`` in run.json (the disk
space the driver held back since the launch, runner/rundir/reserve.py, takes the final records), and the console
names the failed save, the committed checkpoint it falls back to and how to continue (free space, then
``ddp-run resume=<dir>``); where even run.json cannot be written, it says so and what run.json still holds.

No launch: a run whose rank 0 failed saving step_10 on a full disk (step_8 committed, the rank's error record and
log as the engine leaves them) is finalised in this process. The full disk is a real small tmpfs where this process
may mount one (root), and a disk faked at the run directory's writes otherwise."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import torch
from fsspec.implementations.local import LocalFileSystem

from ddp_runner.config.plan import Plan
from ddp_runner.contract import layout
from ddp_runner.job import launching
from ddp_runner.job.invocation import Invocation
from ddp_runner.rundir import reserve, run_dir
from ddp_runner.supervise import finalize
from ddp_runner.tasks.engine import checkpoint as ck

PLAN = Plan(world_size=1, per_rank_batch=8, accumulation=1, global_batch=8, device="cpu", backend="gloo", nnodes=1,
            nproc_per_node=1)
FULL = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _failed_run(run: Path) -> run_dir.RunDir:
    """A continued run whose rank 0 failed saving step_10 because the disk filled; step_8 is committed."""
    (run / layout.PROGRESS).mkdir(parents=True)
    ck.save(str(run / layout.CHECKPOINTS), 8, {"v": torch.tensor([8])}, keep_last=2)
    message = (f"background save of {run}/checkpoints/step_10 failed: RuntimeError('[enforce fail at"
               " inline_container.cc:672] . unexpected pos 7360 vs 7252')")
    (run / layout.rank_log(0)).write_text(f"step 10\nOSError: [Errno 28] No space left on device\n{message}\n")
    (run / layout.rank_error(0)).write_text(json.dumps({
        "rank": 0, "time": 1_760_000_000.0, "type": "CheckpointError", "message": message, "traceback": []}))
    (run / layout.MANIFEST).write_text(json.dumps({"status": "running"}))
    return run_dir.RunDir(url=str(run), local=str(run), fs=LocalFileSystem(), path=str(run))


def _manifest() -> dict:
    return {"status": "running", "versions": {}}


def _assert_account(err: str, run: Path) -> None:
    assert "Traceback" not in err
    assert "step_10" in err and "No space left on device" in err, err
    assert (f"failed: the last complete checkpoint is step_8. Free space on its disk, then continue it with:\n"
            f"  ddp-run resume={run}") in err, err


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (skipped where this process may not mount one)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("this sandbox refuses to mount a tmpfs")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def _fill(disk: Path) -> None:
    """Fill ``disk`` to the last byte, as the run's own saves did."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\xff" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        (disk / "more").write_bytes(b"x" * 4096)


def test_a_real_full_disk_still_records_failed_and_names_the_way_on(small_disk: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    run = small_disk / "2026-01-01" / "00-00-00_smoke_w1"
    rd = _failed_run(run)
    assert reserve.hold(rd)
    _fill(small_disk)
    assert finalize.finish(rd, _manifest(), PLAN, rc=1, interrupted=None) == 1
    err = capsys.readouterr().err
    assert "while finalising" not in err, err
    _assert_account(err, run)
    assert json.loads((run / layout.MANIFEST).read_text())["status"] == "failed"
    assert json.loads((run / layout.SUMMARY).read_text())["status"] == "failed"
    assert not (run / reserve.RESERVE).exists()


def test_a_cause_that_names_the_full_disk_itself_asks_for_space_too(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "2026-01-01" / "00-00-00_smoke_w1"
    rd = _failed_run(run)
    message = f"background save of {run}/checkpoints/step_10 failed: OSError(28, 'No space left on device')"
    (run / layout.rank_error(0)).write_text(json.dumps({
        "rank": 0, "time": 1_760_000_000.0, "type": "CheckpointError", "message": message, "traceback": []}))
    assert finalize.finish(rd, _manifest(), PLAN, rc=1, interrupted=None) == 1
    _assert_account(capsys.readouterr().err, run)


def test_finalising_frees_the_held_space_before_it_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "2026-01-01" / "00-00-00_smoke_w1"
    rd = _failed_run(run)
    assert reserve.hold(rd) and (run / reserve.RESERVE).stat().st_size == reserve.RESERVE_BYTES
    write = run_dir.RunDir.write_text

    def full_while_reserved(self: run_dir.RunDir, rel: str, text: str) -> None:  # the disk is full but for it
        if (run / reserve.RESERVE).exists():
            raise FULL
        write(self, rel, text)

    monkeypatch.setattr(run_dir.RunDir, "write_text", full_while_reserved)
    assert finalize.finish(rd, _manifest(), PLAN, rc=1, interrupted=None) == 1
    _assert_account(capsys.readouterr().err, run)
    assert json.loads((run / layout.MANIFEST).read_text())["status"] == "failed"


def test_when_run_json_cannot_be_written_the_account_says_what_it_holds(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "2026-01-01" / "00-00-00_smoke_w1"
    rd = _failed_run(run)

    def full(self: run_dir.RunDir, rel: str, text: str) -> None:
        raise FULL

    monkeypatch.setattr(run_dir.RunDir, "write_text", full)
    assert finalize.finish(rd, _manifest(), PLAN, rc=1, interrupted=None) == 1
    err = capsys.readouterr().err
    first, *rest = err.strip().splitlines()
    assert first.startswith(f"ddp-run: FAILED while finalising (writing run.json) in {run}: OSError: [Errno 28]")
    assert "run.json could not be updated either (OSError): it still says 'running'" in first
    assert "readers will see the run as lost" in first
    assert rest[0].startswith("ddp-run: the failed save: step_10 (rank 0: CheckpointError: background save of")
    assert rest[0].endswith("(the disk is full)")
    _assert_account(err, run)
    assert json.loads((run / layout.MANIFEST).read_text())["status"] == "running"  # as the account says


def test_the_launch_holds_the_reserve_until_it_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddp_runner.launch.base import Job

    seen = []

    class Launcher:
        def open(self, job: Job) -> run_dir.RunDir:
            return run_dir.create_run_dir(str(tmp_path), "smoke", 1, datetime.now())

        def command(self, plan: object, launcher: object, url: str) -> list[str]:
            return ["torchrun"]

        def launch(self, job: Job, rd: run_dir.RunDir, manifest: dict) -> int:
            seen.append(Path(rd.local, reserve.RESERVE).stat().st_size)
            return 0

    monkeypatch.setattr(launching, "_record_start", lambda job, rd, cmd, how, started, mem, trackers: {})
    monkeypatch.setattr(launching, "_open_trackers", lambda job, rd, how: {})
    conf = {"output": {"root": str(tmp_path)}, "task": {"name": "smoke"}, "launcher": {"name": "local"}, "data": {}}
    out = launching.launch(Job(conf, PLAN, 0.0, written=conf), Launcher(), Invocation(argv=["ddp-run"]),  # type: ignore[arg-type]
                           datetime.now(), None, None)
    assert out.code == 0 and seen == [reserve.RESERVE_BYTES]
    assert not Path(out.run_dir, reserve.RESERVE).exists()


def test_when_only_summary_json_fails_the_account_says_run_json_holds_the_outcome(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "2026-01-01" / "00-00-00_smoke_w1"
    rd = _failed_run(run)
    write = run_dir.RunDir.write_text
    wrote: list[str] = []

    def run_json_once(self: run_dir.RunDir, rel: str, text: str) -> None:  # then the disk is full
        if wrote:
            raise FULL
        wrote.append(rel)
        write(self, rel, text)

    monkeypatch.setattr(run_dir.RunDir, "write_text", run_json_once)
    assert finalize.finish(rd, _manifest(), PLAN, rc=1, interrupted=None) == 1
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"ddp-run: FAILED while finalising (writing summary.json) in {run}"), first
    assert "it still says 'failed', as finalising wrote it" in first and "lost" not in first
    assert json.loads((run / layout.MANIFEST).read_text())["status"] == "failed"
