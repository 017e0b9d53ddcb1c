"""The GPU sampling beside bench/gpt_bench.py's runs: nvidia-smi's CSV parsed, only training-time samples kept."""

from __future__ import annotations

import importlib.util
import os
import stat
from pathlib import Path

import psutil

from tests.support.waiting import wait_for

_spec = importlib.util.spec_from_file_location("gpt_bench", Path(__file__).parents[2] / "bench" / "gpt_bench.py")
gpt_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpt_bench)  # type: ignore[union-attr]


def test_sampler_collects_lines_and_stops_its_process(tmp_path, monkeypatch):
    # A stand-in for nvidia-smi (no GPU here) that prints one sample line per call of its loop, like -lms, after
    # writing its pid down.
    exe = tmp_path / "nvidia-smi"
    # It refuses the reasons field, as an older driver would: the sampler falls back to the basic query.
    exe.write_text("#!/bin/sh\ncase \"$1\" in *reasons*) echo 'not a valid field' >&2; exit 2;; esac\n"
                   f"echo $$ > {tmp_path / 'pid'}\n"
                   "while true; do echo '0, 1980, 600, 50'; sleep 0.05; done\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with gpt_bench.gpu_sampler() as samples:
        wait_for("three samples", lambda: len(samples) >= 3)
    n = len(samples)
    assert n >= 3 and all(line.startswith("0, 1980") for _, line in samples)
    # Its process is gone (not merely quiet for a while): no sample can come after the block.
    pid = int((tmp_path / "pid").read_text())
    assert not psutil.pid_exists(pid), f"the stand-in (pid {pid}) outlived the block"
    assert len(samples) == n, "the sampler process is stopped when the block ends"
