"""Issue 51 item 8: continuing a run on a read-only filesystem is refused before anything is written (exit 2, key
``resume``, the error, the fix), as a new run on one is refused (``output.root``), never an ``OSError`` from
``driver.json``. A real read-only bind mount of a copy of the shared smoke run, through ``ddp_runner.cli.main()`` in
this process (nothing is launched); skipped where this process may not mount (not root). The probe itself is tested
without a mount in tests/unit/test_write_probe.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def read_only_run(tmp_path: Path, smoke_reference: Path) -> Iterator[Path]:
    """A private copy of the shared smoke run (completed, 8 steps), seen through a read-only bind mount."""
    src = tmp_path / "src" / "2026-01-01" / smoke_reference.name
    shutil.copytree(smoke_reference, src)
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root")
    if subprocess.run(["mount", "--bind", str(src.parent.parent), str(mnt)], capture_output=True).returncode:
        pytest.skip("this sandbox refuses mount --bind")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(mnt)], capture_output=True).returncode:
            pytest.skip("this sandbox refuses a read-only remount")
        yield mnt / "2026-01-01" / smoke_reference.name
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_resume_on_a_read_only_filesystem_is_refused_like_a_new_run(read_only_run: Path, tmp_path: Path, cli):
    with pytest.raises(OSError):  # the mount really is read-only
        (read_only_run / "probe").write_text("x")
    before = (read_only_run / "run.json").read_bytes()
    r = cli([f"resume={read_only_run}", "train.max_steps=16"], tmp_path / "out")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "Nothing was started" in r.stderr, r.stderr
    refusal = f"resume='{read_only_run}': cannot be written (OSError: [Errno 30] Read-only file system"
    assert refusal in r.stderr, r.stderr
    assert "remount it read-write" in r.stderr and f"cp -r {read_only_run} <dir>/" in r.stderr
    assert (read_only_run / "run.json").read_bytes() == before
    assert not (tmp_path / "out").exists()
