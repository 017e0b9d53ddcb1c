"""The stop vocabulary both sides share (runner/contract/stops.py), the driver's reading of a stop the ranks agreed
on (runner/launch/finalize.py) and relative data paths made absolute (runner/job/execute.py)."""

from __future__ import annotations

import os
import signal

import pytest

from ddp_runner.contract import layout, stops
from ddp_runner.job.execute import absolute_paths
from ddp_runner.launch import finalize


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
