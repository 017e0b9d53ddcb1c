"""A lost peer node, told as what it was: runner/launch/node_story.py on the nodes' records and the ranks'
progress, as node 0 reads them, and the headline of the stop it caused (runner/supervise/finalize.py,
runner/supervise/stop/outcome.py): a peer's ``ddp-run`` killed takes its torchrun agent down with SIGTERM, which
every rank takes as the stop, though nothing sent this node's driver a signal."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from ddp_runner.config.plan import Plan
from ddp_runner.contract import layout
from ddp_runner.launch import node_story
from ddp_runner.rundir import run_dir
from ddp_runner.supervise import finalize
from ddp_runner.supervise.stop import outcome

ENDED = {"host": "a", "ended": "2026-01-01T00:00:00", "torchrun_exit_code": 0}
LOST = {"host": "b"}  # its driver recorded no end
PROGRESS = {0: {"step": 18, "phase": "log"}, 1: {"step": 17, "phase": "sync"}}
STOPPED = {"step": 18, "signal": int(signal.SIGTERM), "checkpoint": "step_18", "save_s": 0.1,
           "signal_after_step": None, "during": None, "last_step": False}


def test_a_stop_caused_by_a_lost_node_names_the_node_not_a_signal():
    cause = node_story.stop_cause({"0": ENDED, "1": LOST}, None)
    assert cause is not None and cause.startswith("node 1 (host b) was lost (its driver recorded no end")
    line = outcome.lost_peer_line("preempted", cause, STOPPED)
    assert line.startswith("ddp-run: PREEMPTED: node 1 (host b) was lost") and "by SIGTERM" not in line
    assert "every rank stopped after step 18 (this node's driver was sent no signal)" in line
    assert node_story.last_steps(PROGRESS) == {0: 18, 1: 17}
    # A stop's headline says it: no second line after it.
    assert node_story.lines({"0": ENDED, "1": LOST}, "preempted", None, PROGRESS) == []


def test_a_failure_caused_by_a_lost_node_names_it_and_the_last_steps():
    [line] = node_story.lines({"0": ENDED, "1": LOST}, "failed", None, PROGRESS)
    assert line.startswith("ddp-run: a peer node was lost: node 1 (host b)")
    assert "rank 0 after step 18 (log), rank 1 after step 17 (sync)" in line


def test_a_lost_nodes_stale_record_counts_the_step_the_others_prove():
    # The lost node's last copy in the bucket says step 9; rank 0 completed step 14, so rank 1 completed 13.
    stale = {0: {"step": 14, "phase": "log"}, 1: {"step": 9, "phase": "log"}}
    [line] = node_story.lines({"0": ENDED, "1": LOST}, "failed", None, stale)
    assert "rank 0 after step 14 (log), rank 1 after at least step 13 (its last record: step 9, log)" in line
    assert node_story.last_steps(stale) == {0: 14, 1: 13}


def test_nothing_is_said_when_every_driver_ended_or_this_one_was_stopped():
    assert node_story.lines({"0": ENDED, "1": ENDED}, "failed", None, PROGRESS) == []
    assert node_story.lines({"0": ENDED, "1": LOST}, "failed", 15, PROGRESS) == []
    assert node_story.stop_cause({"0": ENDED, "1": ENDED}, None) is None
    assert node_story.stop_cause({"0": ENDED, "1": LOST}, int(signal.SIGTERM)) is None
    assert node_story.lost_nodes({"10": LOST, "2": LOST, "0": ENDED}) == ["2", "10"]


def _stopped_run(run: Path) -> run_dir.RunDir:
    """Two ranks that agreed on a stop after step 18 (rank 1 got its agent's SIGTERM, rank 0 none)."""
    (run / layout.LOGS).mkdir(parents=True)
    for r in (0, 1):
        stop = {**STOPPED, "signal_after_step": 18 if r == 1 else None}
        (run / layout.rank_facts(r)).write_text(json.dumps({"rank": r, "stopped": stop, "summary": {"steps": 18}}))
    return run_dir.RunDir(url=str(run), local=str(run), fs=LocalFileSystem(), path=str(run))


PLAN = Plan(world_size=2, per_rank_batch=8, accumulation=1, global_batch=16, device="cpu", backend="gloo", nnodes=2,
            nproc_per_node=1)


@pytest.mark.parametrize("preempt", [int(signal.SIGTERM), int(signal.SIGUSR2)])
def test_the_headline_of_a_stop_a_lost_peer_caused_names_it_and_the_run_is_preempted(tmp_path, capsys, preempt):
    rd = _stopped_run(tmp_path / "run")
    cause = node_story.stop_cause({"0": ENDED, "1": LOST}, None)
    code = finalize.finish(rd, {"status": "running", "versions": {}}, PLAN, -int(signal.SIGTERM), None,
                           preempt=preempt, lost=cause)
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith("ddp-run: PREEMPTED: node 1 (host b) was lost"), err
    assert "every rank stopped after step 18" in first and "by SIGTERM" not in err
    # Saved: never a failure (a pod exits 128 + SIGTERM, which the manifests' failure policies ignore).
    assert code == 128 + signal.SIGTERM
    summary = json.loads(Path(rd.local, layout.SUMMARY).read_text())
    assert summary["status"] == "preempted" and summary["root_cause"] is None
    assert "checkpoint step_18 committed, nothing lost" in err


def test_a_stop_this_driver_was_sent_keeps_its_signal_headline(tmp_path, capsys):
    rd = _stopped_run(tmp_path / "run")
    finalize.finish(rd, {"status": "running", "versions": {}}, PLAN, -int(signal.SIGTERM), int(signal.SIGTERM),
                    preempt=int(signal.SIGTERM), lost=None)
    assert "ddp-run: PREEMPTED by SIGTERM: every rank stopped after step 18" in capsys.readouterr().err
