"""A run directory that becomes unwritable while the run goes on (issue 30): one console line, no traceback, and
a truthful status where run.json can still be written; a full disk named as such in the root cause."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from ddp_runner.diagnostics import rootcause
from ddp_runner.job import launching
from ddp_runner.job.invocation import Invocation
from ddp_runner.rundir import run_dir


class _Launcher:
    """A launcher whose run fails as a read-only output root makes the driver's writes fail."""

    def open(self, job):  # noqa: ANN001, ANN201
        return run_dir.create_run_dir(job.conf["output"]["root"], "smoke", 1, datetime.now())

    def command(self, plan, launcher, url):  # noqa: ANN001, ANN201
        return ["torchrun"]

    def launch(self, job, rd, manifest):  # noqa: ANN001, ANN201
        raise PermissionError(13, "Permission denied", f"{rd.url}/run.json")


def _job(root: Path) -> object:
    from ddp_runner.launch.base import Job

    plan = type("P", (), {"world_size": 1, "to_manifest": lambda self: {}, "gpus": [], "nproc_per_node": 1,
                          "device": "cpu"})()
    conf = {"output": {"root": str(root)}, "task": {"name": "smoke"}, "launcher": {"name": "local"}, "data": {}}
    return Job(conf, plan, 0.0, written=conf)  # type: ignore[arg-type]


def _stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's start as recorded, and no tracker runs (the default logger, TensorBoard, opens none)."""
    monkeypatch.setattr(launching, "_record_start",
                        lambda job, rd, cmd, how, started, mem, trackers: {"status": "running"})
    monkeypatch.setattr(launching, "_open_trackers", lambda job, rd, how: {})


def test_unwritable_mid_run_ends_with_one_line_and_failed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_ins(monkeypatch)
    out = launching.launch(_job(tmp_path), _Launcher(), Invocation(argv=["ddp-run"]), datetime.now(), None, None)
    err = capsys.readouterr().err
    assert out.code == 1 and out.run_dir
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "PermissionError" in err and "run.json records it" in err
    manifest = json.loads((Path(out.run_dir) / "run.json").read_text())
    assert manifest["status"] == "failed" and "PermissionError" in manifest["finalize_error"]["error"]


def test_when_run_json_cannot_be_written_either_it_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_ins(monkeypatch)

    def refuse(self, rel, text):  # noqa: ANN001, ANN202
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(run_dir.RunDir, "write_text", refuse)
    out = launching.launch(_job(tmp_path), _Launcher(), Invocation(argv=["ddp-run"]), datetime.now(), None, None)
    err = capsys.readouterr().err
    assert out.code == 1 and len(err.strip().splitlines()) == 1
    assert "could not be updated either" in err and "lost" in err


def test_a_full_disk_is_named_in_the_root_cause() -> None:
    cause = {"rank": 0, "message": "[enforce fail at inline_container.cc:664] . unexpected pos 128 vs 64"}
    logs = {0: "...\nOSError: [Errno 28] No space left on device\n..."}
    named = rootcause.with_os_error(cause, logs)
    assert named["message"].startswith("No space left on device (the disk holding the run directory")
    assert "unexpected pos" in named["message"]
    assert rootcause.with_os_error(cause, {0: "fine"}) == cause
