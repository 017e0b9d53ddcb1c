"""Refusal before launch is the rule: every key the engine or a task reads is checked by the driver.

The property tests draw configs that mix valid and invalid values for many keys at once and hold the driver to
its contract both ways: whatever it refuses names a key it was given wrong (exit 2, no run directory), and
whatever it accepts builds and trains in the engine (the real Trainer, in a one-process gloo group) without
failing for a config reason. A few accepted edge configs also run end to end through torchrun.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.driver import ddp_run
from tests.support.run_tree import load_json, run_dirs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "image_classifier"


# -- end to end: accepted edge values run through torchrun --------------------------------------------------


@pytest.mark.parametrize("args", [
    # Every optimizer step clipped, warmup as long as the run, logging and validation off the step grid,
    # one checkpoint kept, synchronous saves, seed 0.
    ["train.max_steps=3", "train.warmup_steps=3", "train.grad_clip=0.5", "train.schedule=cosine",
     "train.log_every=2", "checkpoint.every_steps=1", "checkpoint.keep_last=1", "checkpoint.async_save=false",
     "seed=0", "train.momentum=0.9", "train.min_lr_ratio=0.0"],
    # The example task of a user's own, with its own checks hook, AdamW at betas (0, 0.5), one rank.
    ["--config-dir", str(EXAMPLE / "conf"), "task=tiny_cnn", "world_size=1", "train.max_steps=2",
     "train.betas=[0.0,0.5]", "train.val_every=1", "task.width=4", "data.num_samples=64"],
])
def test_accepted_edge_configs_run_end_to_end(args, out_root):
    r = ddp_run([*args, "device=cpu"], out_root, timeout=180,
                env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)])})
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(out_root)
    assert load_json(run / "summary.json")["status"] == "completed"
