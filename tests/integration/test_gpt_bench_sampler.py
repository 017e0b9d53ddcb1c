"""The GPU sampling beside bench/gpt_bench.py's runs: nvidia-smi's CSV parsed, only training-time samples kept."""

from __future__ import annotations

import importlib.util
import os
import stat
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("gpt_bench", Path(__file__).parents[2] / "bench" / "gpt_bench.py")
gpt_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpt_bench)  # type: ignore[union-attr]


def test_sampler_collects_lines_and_stops_its_process(tmp_path, monkeypatch):
    # A stand-in for nvidia-smi (no GPU here) that prints one sample line per call of its loop, like -lms.
    exe = tmp_path / "nvidia-smi"
    # It refuses the reasons field, as an older driver would: the sampler falls back to the basic query.
    exe.write_text("#!/bin/sh\ncase \"$1\" in *reasons*) echo 'not a valid field' >&2; exit 2;; esac\n"
                   "while true; do echo '0, 1980, 600, 50'; sleep 0.05; done\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with gpt_bench.gpu_sampler() as samples:
        time.sleep(1.0)
    n = len(samples)
    assert n >= 3 and all(line.startswith("0, 1980") for _, line in samples)
    time.sleep(0.3)
    assert len(samples) == n, "the sampler process is stopped when the block ends"
