"""A lost peer node, told as what it was: runner/launch/node_story.py on the nodes' records and the ranks'
progress, as node 0 reads them after its finalisation."""

from __future__ import annotations

from ddp_runner.launch import node_story

ENDED = {"host": "a", "ended": "2026-01-01T00:00:00", "torchrun_exit_code": 0}
LOST = {"host": "b"}  # its driver recorded no end
PROGRESS = {0: {"step": 18, "phase": "log"}, 1: {"step": 17, "phase": "sync"}}


def test_a_stop_caused_by_a_lost_node_says_so_with_each_ranks_last_step():
    [line] = node_story.lines({"0": ENDED, "1": LOST}, "preempted", None, PROGRESS)
    assert "a peer node was lost: node 1 (host b) recorded no end" in line
    assert "this pod's ddp-run was sent no signal" in line
    assert "rank 0 after step 18 (log), rank 1 after step 17 (sync)" in line
    assert node_story.last_steps(PROGRESS) == {0: 18, 1: 17}


def test_a_failure_caused_by_a_lost_node_names_it_and_the_last_steps():
    [line] = node_story.lines({"0": ENDED, "1": LOST}, "failed", None, PROGRESS)
    assert line.startswith("ddp-run: a peer node was lost: node 1 (host b)") and "rank 0 after step 18" in line


def test_nothing_is_said_when_every_driver_ended_or_this_one_was_stopped():
    assert node_story.lines({"0": ENDED, "1": ENDED}, "preempted", None, PROGRESS) == []
    assert node_story.lines({"0": ENDED, "1": LOST}, "preempted", 15, PROGRESS) == []
    assert node_story.lost_nodes({"10": LOST, "2": LOST, "0": ENDED}) == ["2", "10"]
