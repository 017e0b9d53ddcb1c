"""A resume passes over a checkpoint that fails its integrity check (size or sha256 against meta.json) for the
newest older one that passes, and says so; a checkpoint named explicitly fails with the reason; keep_last never
deletes the checkpoint just written for a newer one that may be corrupt.
"""

from __future__ import annotations

import torch

from ddp_runner.tasks.engine import checkpoint as ck
from tests.support.checkpoint_damage import complete_names, truncate
from tests.support.driver import ddp_run
from tests.support.recipes import SMOKE_CKPT2
from tests.support.run_tree import copy_run, load_json

# ------------------------------------------------------------------------------------------------ end to end

# As in test_resume.py: 8 steps on 2 gloo ranks, a checkpoint every 2 (keep_last 2); rank 1 killed after step 7
# leaves step_4 and step_6 (the e2e conftest's smoke_crashed, made once per session: this test damages a copy of it).
SMOKE = SMOKE_CKPT2


def test_corrupt_newest_checkpoint_resume_falls_back_bit_identically(tmp_path, smoke_reference, smoke_crashed):
    clean = smoke_reference  # SMOKE, uninterrupted (made once per session)

    crashed = copy_run(smoke_crashed, tmp_path / "crash")  # (its exit code: asserted non-zero by the fixture)
    assert load_json(crashed / "run.json")["status"] == "failed"
    assert complete_names(crashed / "checkpoints") == ["step_4", "step_6"]
    truncate(crashed / "checkpoints/step_6")

    # Named explicitly: refused before launch, with the reason.
    r = ddp_run([*SMOKE, f"resume={crashed}/checkpoints/step_6"], tmp_path / "explicit")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "fails its integrity check: step_6: state.pt is" in r.stderr and "meta.json says" in r.stderr
    assert not (tmp_path / "explicit").exists()

    r = ddp_run([f"resume={crashed}"], tmp_path / "unused")
    assert r.returncode == 0, r.stdout + r.stderr
    said = "step_6 failed its integrity check ("
    assert said in r.stdout and "; resuming from step_4" in r.stdout, r.stdout
    assert said in (crashed / "logs/rank0.log").read_text()
    summary = load_json(crashed / "summary.json")
    assert summary["resumed_from"].endswith("checkpoints/step_4") and summary["steps"] == 8
    assert summary["losses"] == load_json(clean / "summary.json")["losses"]
    ours, theirs = (ck.load(ck.latest(f"{run}/checkpoints"))["model"] for run in (crashed, clean))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert complete_names(crashed / "checkpoints") == ["step_4", "step_6", "step_8"], "step_6 rewritten, step_4 kept"
