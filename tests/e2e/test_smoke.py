"""End-to-end: real torchrun, real gloo process groups, real TensorBoard files, through the CLI."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support.run_tree import load_json, run_dirs


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_smoke_two_ranks_gloo_tree_and_manifest(out_root):
    # As ddp_run() would start it, under a permissive umask (022): without output.private, the run's files follow
    # the umask as a plain open() would (the owner-only case: test_multirun_sweep_one_dir_per_job_and_private_…).
    r = subprocess.run([sys.executable, "-m", "ddp_runner", "task=smoke", "world_size=2", "batch.per_rank=8",
                        "batch.accumulation=2", "device=cpu", "output.private=false", f"output.root={out_root}"],
                       cwd=tempfile.gettempdir(), capture_output=True, text=True, timeout=240,
                       preexec_fn=lambda: os.umask(0o022))
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(out_root)
    assert r.stdout.strip().splitlines()[-1] == str(run), "the run directory is the last line"
    assert "global batch 32 = 8 per rank × 2 ranks × 2 accumulation" in r.stdout
    # <root>/<YYYY-MM-DD>/<HH-MM-SS>_smoke_w2
    assert run.parent.parent == out_root and run.name.endswith("_smoke_w2")
    for item in ("config.yaml", "run.json", "summary.json", "logs/rank0.log", "logs/rank1.log", "tb", "checkpoints"):
        assert (run / item).exists(), item

    manifest = load_json(run / "run.json")
    assert manifest["status"] == "completed"
    assert {k: manifest["plan"][k] for k in ("world_size", "per_rank_batch", "accumulation", "global_batch")} == {
        "world_size": 2, "per_rank_batch": 8, "accumulation": 2, "global_batch": 32}
    assert manifest["command"][-3:] == ["-m", "ddp_runner.tasks", str(run)]
    assert manifest["exit_codes"] == {"0": 0, "1": 0}
    assert manifest["versions"]["torch"] and manifest["versions"]["python"]
    assert manifest["host"] and manifest["started"] and manifest["ended"]
    assert [d["local_rank"] for d in manifest["devices"]] == [0, 1]

    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["batch"]["accumulation"] == 2 and config["device"] == "cpu" and config["backend"] == "gloo"

    summary = load_json(run / "summary.json")
    assert summary["completion"]["all_completed"] and summary["completion"]["distinct_devices"]
    assert summary["global_batch"] == 32
    for rank in (0, 1):
        assert f"rank {rank} device cpu:{rank} completed" in (run / f"logs/rank{rank}.log").read_text()

    # 64 samples / (8 × 2 × 2) = 2 optimizer steps per epoch, 2 epochs: x-axis is the optimizer step.
    loss = scalars(run, "train/loss")
    assert [s for s, _ in loss] == [1, 2, 3, 4]
    assert summary["steps"] == 4 and summary["losses"] == pytest.approx([v for _, v in loss])
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    assert "plan/text_summary" in acc.Tags()["tensors"]
    # Where the wall-clock went: the start-up's parts add up to its share, and the console says the same.
    g = summary["goodput"]
    parts = g["startup_parts"]
    assert list(parts) == ["driver", "agent", "imports", "process_group", "build", "loop_setup"]
    assert all(v >= 0 for v in parts.values()) and parts["imports"] > 0.1 and parts["agent"] > 0.1
    assert sum(parts.values()) == pytest.approx(g["seconds"]["startup"], abs=0.01)
    # Piped output: rank 0's plain step lines with units; a 4-step run closes with one line (the detail stays in
    # summary.json), whose figures are the summary's.
    lines = r.stdout.splitlines()
    steps = [line for line in lines if line.startswith("  step ")]
    assert [line.split()[1] for line in steps] == ["1/4", "2/4", "3/4", "4/4"]
    assert all(re.fullmatch(r"  step \d/4  loss \d+\.\d{4}  [\d,]+ samples/s", line) for line in steps), steps
    assert lines[-2] == (
        "ddp-run: completed: 4 steps, 2 ranks on distinct devices (cpu:0, cpu:1),"
        f" final loss {summary['final']['train/loss']:.4f}, {g['wall_s']:.1f} s wall-clock"
        f" ({g['seconds']['startup']:.1f} s start-up),"
        f" goodput {g['samples_per_s']:,.0f} samples/s; details: {run / 'summary.json'}")
    assert not (run / "logs" / "console.jsonl").exists()  # no terminal: no records for a bar
    # Only the driver makes directories: no Hydra output dirs anywhere.
    assert not list(out_root.parent.rglob(".hydra")) and not (Path(tempfile.gettempdir()) / "outputs").exists()
    # output.private=false under umask 022: a checkpoint and TensorBoard's events were written, and the files
    # are readable by others.
    paths = [run, *run.rglob("*")]
    assert any(p.name == "state.pt" for p in paths) and any("tfevents" in p.name for p in paths)
    assert stat.S_IMODE((run / "run.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((run / "config.yaml").stat().st_mode) == 0o644


# Runs started in the same second get distinct directories (the later one the next free name): claimed for one
# second by racing claimants, in process, at every run of the suite: tests/integration/test_run_dir_same_second.py.
# (Here two real drivers collided only when both started within the same second, up to three tries of two launches,
# and skipped otherwise.)


def test_multirun_sweep_one_dir_per_job_and_private_run_directories_are_owner_only(tmp_path):
    """A ``-m`` sweep makes one directory per job under one sweep directory.

    Its launch (two 2-rank jobs, under a permissive umask, with ``output.private=true``) is also the check that
    every file and folder of a run (logs, TensorBoard, checkpoints, run.json) is owner-only whatever the umask;
    without it, files follow the umask as a plain open() would (that case:
    test_smoke_two_ranks_gloo_tree_and_manifest, under the same umask). One launch for both (it was two)."""
    root = tmp_path / "outputs"
    cmd = [sys.executable, "-m", "ddp_runner", "-m", "device=cpu", "world_size=2", "batch.per_rank=4,8",
           "train.epochs=1", "checkpoint.every_steps=4", "output.private=true", f"output.root={root}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                       preexec_fn=lambda: os.umask(0o022))
    assert r.returncode == 0, r.stdout + r.stderr
    runs = run_dirs(root)
    assert len(runs) == 2 and runs[0].parent == runs[1].parent and runs[0].parent.name.endswith("_sweep")
    assert sorted(load_json(r / "run.json")["plan"]["global_batch"] for r in runs) == [8, 16]

    for run in runs:
        paths = [run, *run.rglob("*")]
        assert any(p.name == "state.pt" for p in paths) and any("tfevents" in p.name for p in paths)
        assert (run / "logs/rank1.log").exists(), "both ranks' files are checked"
        open_to_others = [str(p) for p in paths if stat.S_IMODE(p.stat().st_mode) & 0o077]
        assert open_to_others == []


# A failing rank named as the root cause (its exception, exit code and traceback in summary.json and on the
# console): tests/e2e/test_diagnostics_e2e.py::test_an_exception_is_attributed_to_its_rank_and_class.


# A signal to the driver (SIGTERM, SIGINT) stops the run within bounds, says so, leaves no process and reads as
# interrupted: tests/e2e/test_guards_e2e.py::test_sigterm_is_forwarded_so_the_run_stops_well_inside_the_grace.


# output.private=true makes every file and folder of a run owner-only whatever the umask: the sweep's launch of
# test_multirun_sweep_one_dir_per_job_and_private_run_directories_are_owner_only (above).
