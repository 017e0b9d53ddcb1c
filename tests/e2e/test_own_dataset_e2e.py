"""Issue 51 item 2 end to end: a task of the user's own that loads 32,768 samples from its own file, told to the
driver by its checks module's ``train_samples(cfg)``, runs on 2 CPU ranks with batch.per_rank=64 (it was refused:
"the training set has 64 samples"), and the run's records agree with what the ranks trained on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

USER_TASKS = Path(__file__).resolve().parents[1] / "support" / "user_tasks"


def test_a_task_with_its_own_dataset_runs_with_the_plan_made_on_its_real_size(tmp_path: Path):
    from tests.support.user_tasks import own_file_regression

    records = tmp_path / "records.bin"
    own_file_regression.write(str(records), 32768)
    r = subprocess.run([sys.executable, "-P", "-m", "ddp_runner", "task.module=own_file_regression",
                        "task.checks=own_file_regression_checks", f"+task.file={records}", "batch.per_rank=64",
                        "world_size=2", "device=cpu", "train.max_steps=3", "timeout_s=120",
                        f"output.root={tmp_path / 'out'}"], cwd=USER_TASKS, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    [run] = [p.parent for p in (tmp_path / "out").glob("*/*/run.json")]
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["plan"]["train_samples"] == 32768 and manifest["plan"]["global_batch"] == 128
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["num_samples"] == 32768
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 3, summary
