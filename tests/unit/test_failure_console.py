"""A failed run's console (runner/supervise/finalize.py): the one-line cause and the user's line (``where:``) first,
then whole frames of its traceback, never a fragment that starts inside a frame; the error said once (issue 51 item
10). The record is a real one: a task whose ``forward`` takes ``(x)`` where the engine calls ``model(x, y)``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_runner.diagnostics import rootcause
from ddp_runner.supervise import finalize
from tests.support.failed_runs import two_ranks_failed

TORCH = "/venv/lib/python3.11/site-packages/torch/nn"
MESSAGE = "Net.forward() takes 2 positional arguments but 3 were given"
# The last 12 lines of the traceback, as tasks/engine/worker_io.py records them: they start inside a frame.
TAIL = [
    "    else self._run_ddp_forward(*inputs, **kwargs)",
    "         ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    f'  File "{TORCH}/parallel/distributed.py", line 1715, in _run_ddp_forward',
    "    return self.module(*inputs, **kwargs)  # type: ignore[index]",
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    f'  File "{TORCH}/modules/module.py", line 1778, in _wrapped_call_impl',
    "    return self._call_impl(*args, **kwargs)",
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    f'  File "{TORCH}/modules/module.py", line 1789, in _call_impl',
    "    return forward_call(*args, **kwargs)",
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    f"TypeError: {MESSAGE}",
]
WHERE = "/home/me/badfwd.py:11 in Net.forward (the engine calls model(x, y))"


def test_frames_are_whole_and_leave_out_the_markers_and_the_exception_line() -> None:
    assert rootcause.frames(TAIL) == [
        f'  File "{TORCH}/parallel/distributed.py", line 1715, in _run_ddp_forward',
        "    return self.module(*inputs, **kwargs)  # type: ignore[index]",
        f'  File "{TORCH}/modules/module.py", line 1778, in _wrapped_call_impl',
        "    return self._call_impl(*args, **kwargs)",
        f'  File "{TORCH}/modules/module.py", line 1789, in _call_impl',
        "    return forward_call(*args, **kwargs)"]
    assert rootcause.frames(TAIL, most=1) == TAIL[8:10]
    assert rootcause.frames(["torchrun: something went wrong"]) == []


def test_the_console_shows_the_cause_first_then_the_frames(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    rd, plan = two_ranks_failed(run, MESSAGE, TAIL, WHERE)

    assert finalize.finish(rd, {"versions": {}}, plan, rc=1, interrupted=None) == 1

    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"ddp-run: FAILED: earliest error on rank 1 [exception]: TypeError: {MESSAGE}", err
    assert err[1] == f"  where: {WHERE}", err  # the user's file and line, right under the cause
    assert err[2] == f"  its last frames (the whole traceback: {run}/logs/rank1.log):", err
    assert err[3].startswith('    File "') and "_run_ddp_forward" in err[3], err  # a whole frame, not mid-stack
    assert not any(line.strip().startswith("^") for line in err)
    assert sum(MESSAGE in line for line in err) == 1, err  # once: rank 0's same error is not said again
    assert "ddp-run: then rank 0: exception: the same error" in err, err
    assert sum("where:" in line for line in err) == 1, err


def test_a_cause_without_a_traceback_is_one_line() -> None:
    hang = {"rank": 1, "class": "hang", "type": "hang", "message": "no progress for 60 s", "traceback": []}
    assert rootcause.account(hang, "FAILED") == ["FAILED: earliest error on rank 1 [hang]: hang: no progress for 60 s"]
    launcher = {"rank": None, "class": "launcher_error", "type": "LauncherError", "message": "torchrun exited with 1",
                "traceback": ["torchrun: rendezvous failed"]}
    assert rootcause.account(launcher, "FAILED") == [
        "FAILED: earliest error on the launcher [launcher_error]: LauncherError: torchrun exited with 1",
        "    torchrun: rendezvous failed"]
