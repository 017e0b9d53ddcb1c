"""Issue 51 item 10: a user's task whose model's ``forward`` takes the wrong arguments
(tests/support/user_tasks/wrong_forward.py: ``forward(self, x)`` where the engine calls ``model(x, y)``). The
console's account leads with the cause and ``where: <the user's file>:<line>``, torch's frames after them, and says
the error once (the account's parts, on a synthetic record: tests/unit/test_failure_console.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ddp_runner.contract import layout

USER_TASKS = Path(__file__).resolve().parents[1] / "support" / "user_tasks"
MESSAGE = "TakesOnlyX.forward() takes 2 positional arguments but 3 were given"


def test_a_wrong_forward_signature_is_said_once_with_the_users_line_first(tmp_path: Path) -> None:
    source = (USER_TASKS / "wrong_forward.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "def forward" in text)
    # -P as the ddp-run script: the task module is found in the working directory, as a user's would be.
    r = subprocess.run([sys.executable, "-P", "-m", "ddp_runner", "device=cpu", "world_size=1", "train.max_steps=1",
                        "task=smoke", "task.module=wrong_forward", "timeout_s=60", f"output.root={tmp_path}"],
                       cwd=USER_TASKS, capture_output=True, text=True, timeout=240)
    assert r.returncode not in (0, layout.EXIT_REFUSED), r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    said = [i for i, text in enumerate(err) if MESSAGE in text]
    assert len(said) == 1, r.stderr  # once
    at = said[0]
    assert err[at] == f"ddp-run: FAILED: earliest error on rank 0 [exception]: TypeError: {MESSAGE}", r.stderr
    assert err[at + 1].startswith(f"  where: {USER_TASKS / 'wrong_forward.py'}:{line} in TakesOnlyX.forward"), r.stderr
    frames = [i for i, text in enumerate(err) if text.lstrip().startswith('File "')]
    assert frames and min(frames) > at + 1, r.stderr  # torch's frames after the cause and the user's line
    assert sum("where:" in text for text in err) == 1, r.stderr
