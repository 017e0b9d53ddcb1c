"""The stop vocabulary both sides share (runner/contract/stops.py), the driver's reading of a stop the ranks agreed
on (runner/supervise/finalize.py) and relative data paths made absolute (runner/job/execute.py)."""

from __future__ import annotations

import os
import signal

import pytest

from ddp_runner.contract import layout, stops
from ddp_runner.job.execute import absolute_paths
from ddp_runner.supervise import finalize
from ddp_runner.supervise.stop import outcome as stop_outcome


@pytest.mark.parametrize("value, num", [("SIGUSR2", signal.SIGUSR2), ("usr2", signal.SIGUSR2), ("TERM", signal.SIGTERM),
                                        (15, signal.SIGTERM), ("12", 12), (None, None)])
def test_parse_signal(value, num):
    assert stops.parse_signal(value) == num


@pytest.mark.parametrize("value", ["SIGUSR1", "USR1", 10, "KILL", "nope", 999])
def test_parse_signal_refuses(value):
    with pytest.raises(ValueError):
        stops.parse_signal(value)


def test_statuses():
    assert stops.stop_status(signal.SIGUSR2, signal.SIGUSR2) == layout.STATUS_PREEMPTED
    assert stops.stop_status(signal.SIGINT, signal.SIGUSR2) == layout.STATUS_INTERRUPTED
    assert finalize.outcome(False, signal.SIGUSR2, signal.SIGUSR2) == "preempted"
    assert finalize.outcome(True, None) == "completed"
    assert stops.of({}) == (signal.SIGUSR2, stops.DEFAULT_GRACE_S)


def test_a_stop_counts_only_when_every_rank_reports_it():
    one = {"step": 5, "signal": 15, "checkpoint": "step_5"}
    assert finalize.agreed_stop({0: {"stopped": one}, 1: {"stopped": one}}, 2) == one
    assert finalize.agreed_stop({0: {"stopped": one}, 1: {"completed": False}}, 2) is None
    assert finalize.agreed_stop({0: {"stopped": one}}, 2) is None


def test_relative_data_paths_become_absolute_and_the_spelling_is_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conf = {"data": {"path": "tokens/train.bin", "val_path": "s3://b/val.bin"}}
    assert absolute_paths(conf) == {"data.path": "tokens/train.bin"}
    assert conf["data"] == {"path": os.path.join(str(tmp_path), "tokens/train.bin"), "val_path": "s3://b/val.bin"}


def test_a_stop_after_the_last_step_names_what_it_cut_and_the_command_that_finishes_it():
    last = {"step": 12, "signal": 2, "checkpoint": "step_12", "during": "the final validation", "last_step": True}
    assert stop_outcome.stopped_line("interrupted", "SIGINT", last) == (
        "ddp-run: INTERRUPTED by SIGINT: every rank stopped after step 12, the last, during the final validation")
    saved, command = stop_outcome.continue_lines("/r/run", "interrupted", last)
    assert saved.startswith("ddp-run: interrupted: checkpoint step_12 committed, nothing lost; training is done")
    assert command == "  ddp-run resume=/r/run"
    mid = {"step": 6, "signal": 15, "checkpoint": "step_6", "during": "the validation at step 6", "last_step": False}
    assert stop_outcome.stopped_line("preempted", "SIGTERM", mid).endswith(
        "after step 6, during the validation at step 6")
    assert stop_outcome.continue_lines("/r/run", "preempted", mid)[0] == (
        "ddp-run: preempted: checkpoint step_6 committed, nothing lost. Continue it with:")
    older = {"step": 7, "signal": 2, "checkpoint": "step_7"}  # a rank record written before "during" existed
    assert stop_outcome.stopped_line("interrupted", "SIGINT", older).endswith("every rank stopped after step 7")


def test_a_stop_that_reached_the_ranks_after_their_work_cut_nothing():
    done = {"all_completed": True}
    assert stop_outcome.came_after_the_end({0: {"completed": True}, 1: {"completed": True}}, done, 2)
    assert not stop_outcome.came_after_the_end({0: {"completed": True}}, done, 2)  # rank 1 never reported
    stopped = {"step": 4, "checkpoint": "step_4"}
    assert not stop_outcome.came_after_the_end({0: {"completed": True, "stopped": stopped}, 1: {"completed": True}},
                                               done, 2)
    assert not stop_outcome.came_after_the_end({0: {"completed": True}}, {"all_completed": False}, 1)
    assert stop_outcome.cut_nothing(None, 2, {0: {"completed": True}}, done, 1)
    assert not stop_outcome.cut_nothing(None, None, {0: {"completed": True}}, done, 1)  # no stop was sent
    assert not stop_outcome.cut_nothing(stopped, 2, {0: {"completed": True, "stopped": stopped}}, done, 1)
