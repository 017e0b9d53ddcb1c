"""ddp-tokenize: a real BPE trained on real text, files and meta.json checked byte for byte, refusals, and
a real 2-rank run on the output (through the CLI)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.support.driver import ddp_run
from tests.support.run_tree import load_json, run_dirs
from tests.support.tokenized import CHECKOUT_ENV


def test_trains_on_its_output_two_ranks(tokenized, tmp_path: Path) -> None:
    _, out, _, _ = tokenized
    r = ddp_run(["task=gpt", "device=cpu", "world_size=2", "train.max_steps=6", "checkpoint.async_save=false",
                 f"data.path={out}/train.bin", f"data.val_path={out}/val.bin", "task.model.vocab=1024"],
                tmp_path / "runs", env=CHECKOUT_ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = run_dirs(tmp_path / "runs")
    summary = load_json(run / "summary.json")
    assert summary["status"] == "completed" and summary["steps"] == 6
    assert summary["losses"][0] == pytest.approx(np.log(1024), abs=0.5)  # uniform over the vocabulary at init
    assert np.isfinite(summary["val_loss"])
