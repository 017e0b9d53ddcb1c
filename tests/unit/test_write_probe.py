"""Issue 51 item 8, the probe alone: a run directory that cannot be written is refused as ``resume`` (exit 2) before
the lease, for the directory itself or a folder the workers write into; a writable one leaves no trace."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from ddp_runner.contract.errors import PlanError
from ddp_runner.rundir import run_dir


def _run(tmp_path: Path) -> run_dir.RunDir:
    path = tmp_path / "2026-01-01" / "00-00-00_smoke_w1"
    for sub in ("checkpoints", "logs"):
        (path / sub).mkdir(parents=True)
    return run_dir.open_run_dir(str(path))


def test_a_writable_run_directory_passes_and_keeps_no_probe(tmp_path: Path) -> None:
    rd = _run(tmp_path)
    run_dir.check_writable(rd)
    assert sorted(p.name for p in Path(rd.local).rglob("*")) == ["checkpoints", "logs"]


@pytest.mark.parametrize("where", ["", "checkpoints", "logs"])
def test_an_unwritable_folder_is_a_resume_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  where: str) -> None:
    rd = _run(tmp_path)
    refused = os.path.join(rd.local, where) if where else rd.local
    real = tempfile.mkstemp

    def mkstemp(prefix: str, dir: str) -> tuple[int, str]:  # noqa: A002 - tempfile's own name
        if dir == refused:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.path.join(dir, prefix))
        return real(prefix=prefix, dir=dir)

    monkeypatch.setattr(run_dir.tempfile, "mkstemp", mkstemp)
    with pytest.raises(PlanError) as refusal:
        run_dir.check_writable(rd)
    err = refusal.value
    assert err.key == "resume" and err.value == rd.url
    assert err.problem.startswith("cannot be written (OSError: [Errno 30] Read-only file system")
    assert "remount it read-write" in err.fix and f"cp -r {rd.url} <dir>/" in err.fix


def test_a_file_in_place_of_the_run_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.write_text("not a directory")
    with pytest.raises(PlanError, match="cannot be written \\(NotADirectoryError"):
        run_dir.check_writable(run_dir.open_run_dir(str(path)))


def test_a_store_that_refuses_the_lease_is_the_same_refusal() -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    from ddp_runner.rundir import lease

    class ReadOnlyStore(MemoryFileSystem):
        def pipe_file(self, path: str, value: bytes, **kwargs: object) -> None:
            raise PermissionError(13, "Access Denied")

    url = "memory://bucket/2026-01-01/00-00-00_smoke_w1"
    with pytest.raises(PlanError) as refusal:
        lease.take_or_refuse(ReadOnlyStore(), "/bucket/2026-01-01/00-00-00_smoke_w1", url)
    assert refusal.value.key == "resume" and refusal.value.value == url
    assert refusal.value.problem.startswith("cannot be written (PermissionError: [Errno 13] Access Denied)")
    assert f"cp -r {url} <dir>/" in refusal.value.fix
