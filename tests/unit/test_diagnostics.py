"""Diagnostics in-process: the checks of watchdog.* / fault.* / debug, the root-cause classification, the stack
parsing, the progress heartbeat and the injected faults (the end-to-end runs: test_diagnostics_e2e.py)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from ddp_runner.config import diagnostic_keys
from ddp_runner.contract import layout
from ddp_runner.contract.errors import PlanError
from ddp_runner.diagnostics import rootcause
from ddp_runner.diagnostics import setup as diagnostics
from ddp_runner.diagnostics.watchdog import top_frame

BASE = {"timeout_s": 600, "watchdog": {"timeout_s": 120}, "debug": False, "train": {"max_steps": 10},
        "fault": {"kind": None, "rank": 1, "step": 3, "slow_s": 5.0, "also": []}}


def _conf(**changes):
    conf = json.loads(json.dumps(BASE))
    for dotted, value in changes.items():
        node = conf
        *parents, last = dotted.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    return conf


@pytest.mark.parametrize(("changes", "key"), [
    ({"watchdog__timeout_s": 600}, "watchdog.timeout_s"),
    ({"watchdog__timeout_s": -1}, "watchdog.timeout_s"),
    ({"watchdog__timeout_s": "soon"}, "watchdog.timeout_s"),
    ({"debug": "yes"}, "debug"),
    ({"fault__kind": "segfault"}, "fault.kind"),
    ({"fault__kind": "hang", "fault__rank": 2}, "fault.rank"),
    ({"fault__kind": "hang", "fault__step": 0}, "fault.step"),
    ({"fault__kind": "hang", "fault__step": 11}, "fault.step"),
    ({"fault__kind": "slow", "fault__slow_s": 0}, "fault.slow_s"),
    ({"fault__kind": "hang", "fault__also": [{"kind": "hang", "rank": 5, "step": 1}]}, "fault.also[0].rank"),
])
def test_bad_diagnostics_settings_are_refused_with_key_and_fix(changes, key):
    with pytest.raises(PlanError) as err:
        diagnostic_keys.check(_conf(**changes), world_size=2)
    assert err.value.key == key and err.value.fix


def test_good_settings_pass_and_a_continued_run_drops_the_fault():
    for timeout, expected in ((600, 120), (60, 30)):
        conf = _conf(timeout_s=timeout, watchdog__timeout_s="auto")
        diagnostic_keys.resolve(conf)
        assert conf["watchdog"]["timeout_s"] == expected
    diagnostic_keys.check(_conf(watchdog__timeout_s=0), world_size=2)
    conf = _conf(fault__kind="slow", fault__rank=0)
    diagnostic_keys.check(conf, world_size=2)
    assert diagnostic_keys.without_fault(conf) and conf["fault"]["kind"] is None
    assert not diagnostic_keys.without_fault(conf)


def test_debug_and_flight_recorder_environment(monkeypatch):
    env = diagnostics.worker_env(_conf(debug=True), "nccl")
    assert env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL" and env["NCCL_DEBUG"] == "INFO"
    assert env["TORCH_CPP_LOG_LEVEL"] == "INFO" and env[layout.ENV_DEBUG] == "1"
    # The name this torch reads (the older one makes recent torch warn on every rank); a user's own size wins.
    name = diagnostics.flight_recorder_variable()
    assert name in diagnostics.FLIGHT_RECORDER_VARIABLES and int(env[name]) > 0
    assert not set(diagnostics.FLIGHT_RECORDER_VARIABLES) - {name} & set(env)
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "50")
    assert not set(diagnostics.FLIGHT_RECORDER_VARIABLES) & set(diagnostics.worker_env(_conf(debug=True), "nccl"))
    assert diagnostics.worker_env(_conf(watchdog__timeout_s=0), "nccl") == {}
    assert diagnostics.worker_env(_conf(), "gloo") == {}
    # torch 2.11's Python side does not name TORCH_FR_BUFFER_SIZE, yet its C++ side warns about the older name.
    assert diagnostics.flight_recorder_variable_for("2.11.0+cu130", "") == "TORCH_FR_BUFFER_SIZE"
    assert diagnostics.flight_recorder_variable_for("2.5.1", "") == "TORCH_NCCL_TRACE_BUFFER_SIZE"
    assert diagnostics.flight_recorder_variable_for(None, "'TORCH_FR_BUFFER_SIZE'") == "TORCH_FR_BUFFER_SIZE"


# ------------------------------------------------------------------------------------------------ root cause

def _err(rank, t, typ, msg):
    return {"rank": rank, "time": t, "type": typ, "message": msg,
            "traceback": ['  File "/x/task.py", line 7, in forward', f"{typ}: {msg}"]}


def test_a_killed_rank_is_the_cause_and_its_peer_lost_error_a_consequence():
    cause = rootcause.root_cause({
        "world_size": 2, "rc": 1,
        # rank 0's collective failed *before* the driver saw rank 1 gone: the class decides, not the clock
        "errors": {0: _err(0, 100.0, "DistBackendError", "Connection closed by peer [127.0.0.1]:4242")},
        "progress": {1: {"step": 7, "phase": "sync"}},
        "watch": {"gone": {1: {"time": 100.4, "exit_code": None}}},
        "exit_codes": {"0": 1, "1": -9}})
    assert (cause["rank"], cause["class"], cause["type"]) == (1, "signal", "SIGKILL")
    assert "SIGKILL" in cause["message"] and cause["where"] == "last reported after step 7, in phase sync"
    assert cause["consequences"] == [{"rank": 0, "class": "peer_lost",
                                      "message": "Connection closed by peer [127.0.0.1]:4242"}]


def test_a_killed_ranks_stale_record_is_named_with_the_step_the_others_prove_it_completed():
    # Issue 52 item 6: a whole pod SIGKILLed under an s3:// root. Rank 1's record is its node's last copy into the
    # bucket (mirrored every 15 s), from start-up; rank 0, in step with it, completed step 18.
    evidence = {"world_size": 2, "rc": 1,
                "errors": {0: _err(0, 100.0, "DistBackendError", "Connection reset by peer [127.0.0.1]:4242")},
                "progress": {0: {"step": 18, "phase": "sync"}, 1: {"step": 0, "phase": "startup"}},
                "watch": {"gone": {1: {"time": 100.4, "exit_code": -9}}}, "exit_codes": {"0": 1}}
    cause = rootcause.root_cause(evidence)
    assert cause["rank"] == 1 and cause["where"] == (
        "last reported after step 0, in phase startup; it completed at least step 17 (it took part in step 18's"
        " gradient sync, which rank 0 completed)")
    # No record of its own copied at all: not "before training started".
    del evidence["progress"][1]
    assert rootcause.root_cause(evidence)["where"].startswith("before training started; it completed at least step 17")
    # A record one step behind the others' is as fresh as records get (written once a second): said as it is.
    assert rootcause.least_step({0: {"step": 18}, 1: {"step": 17}}, 1) is None
    assert rootcause.least_step({0: {"step": 1}}, 1) is None
    # A record of an earlier start (torchrun restarted the ranks from step_10's checkpoint) proves nothing.
    restarted = {0: {"step": 20, "start_step": 0}, 1: {"step": 11, "start_step": 10}, 2: {"step": 12, "start_step": 10}}
    assert rootcause.least_step(restarted, 1) is None and rootcause.least_step(restarted, 2) is None
    # No record of its own: the latest start's records count (rank 2's step 14, not rank 1's older step 20).
    assert rootcause.least_step({1: {"step": 20, "start_step": 0}, 2: {"step": 14, "start_step": 10}}, 0) == (13, 2)


def test_oom_killer_evidence_makes_a_sigkill_an_oom():
    cause = rootcause.root_cause({"world_size": 2, "rc": 1, "watch": {"gone": {1: {"time": 5.0, "exit_code": -9}},
                                                                      "oom_kills": 1}})
    assert cause["rank"] == 1 and cause["class"] == "oom" and "OOM killer" in cause["message"]


@pytest.mark.parametrize(("typ", "msg", "cls"), [
    ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("RuntimeError", "[gloo] Timed out waiting 30000ms for recv operation to complete", "collective_timeout"),
    ("DistBackendError", "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)", "collective_timeout"),
    ("RuntimeError", "Connection reset by peer", "peer_lost"),
    ("ValueError", "bad value", "exception"),
])
def test_error_records_are_classified(typ, msg, cls):
    assert rootcause.classify_error({"type": typ, "message": msg}) == cls


def test_the_earliest_real_failure_wins_over_earlier_consequences():
    cause = rootcause.root_cause({"world_size": 3, "rc": 1, "errors": {
        0: _err(0, 1.0, "RuntimeError", "Timed out waiting 30000ms for recv"),
        1: _err(1, 3.0, "ValueError", "second"),
        2: _err(2, 2.0, "OutOfMemoryError", "CUDA out of memory")}})
    assert (cause["rank"], cause["class"]) == (2, "oom")
    assert cause["where"] == "/x/task.py:7 in forward"
    assert [c["rank"] for c in cause["consequences"]] == [0, 1] and cause["other_failed_ranks"] == [0, 1]
    alone = rootcause.root_cause({"world_size": 2, "rc": 1, "errors": {0: _err(0, 1.0, "RuntimeError", "timeout")}})
    assert alone["class"] == "collective_timeout"


def test_hang_terminated_ranks_launcher_error_and_interruption():
    hang = {"rank": 1, "time": 50.0, "step": 3, "phase": "log", "top_frame": "a.py:1 in f", "stacks": "logs/stacks",
            "message": "no progress for 10 s"}
    cause = rootcause.root_cause({"world_size": 2, "rc": 1, "watch": {"hang": hang},
                                  "progress": {0: {"step": 3, "phase": "terminated", "since": 51.0}}})
    assert (cause["rank"], cause["class"]) == (1, "hang") and "a.py:1 in f" in cause["where"]
    assert cause["consequences"][0]["rank"] == 0 and cause["consequences"][0]["class"] == "signal"
    assert "earliest error on rank 1 [hang]" in rootcause.headline(cause)
    launcher = rootcause.root_cause({"world_size": 2, "rc": 1, "agent_tail": ["x", "RendezvousError: no peers"]})
    assert launcher["class"] == "launcher_error" and "RendezvousError" in launcher["message"]
    silent = rootcause.root_cause({"world_size": 2, "rc": 1, "agent_tail": []})  # not a message ending in ": "
    assert silent["message"] == ("torchrun exited with 1 and no rank left a record: its own log (logs/torchrun.log)"
                                 " is empty or missing")
    stopped = rootcause.root_cause({"world_size": 1, "rc": -15, "interrupted": 2,
                                    "progress": {0: {"phase": "terminated", "since": 1.0}}})
    assert stopped["class"] == "interrupted"
    assert rootcause.root_cause({"world_size": 2, "rc": 0}) is None


def test_a_rank_ended_by_the_drivers_stop_before_its_handler_is_a_consequence():
    # SIGTERM to the driver while rank 0 was still starting: it died of SIGTERM's default action (no record, no
    # progress) and torchrun, stopped itself, gave no exit code. The stop is the cause, the rank its consequence.
    gone = {"gone": {0: {"time": 5.0, "exit_code": None}}}
    stopped = rootcause.root_cause({"world_size": 2, "rc": -15, "interrupted": 15, "watch": gone,
                                    "progress": {1: {"step": 0, "phase": "terminated", "since": 5.1}}})
    assert (stopped["class"], stopped["message"]) == ("interrupted", "interrupted by signal 15"), stopped
    assert [c["rank"] for c in stopped["consequences"]] == [0, 1]
    # The same death with no stop asked for is the rank's own, and a known SIGKILL stays the cause either way.
    alone = rootcause.root_cause({"world_size": 2, "rc": 1, "watch": gone})
    assert (alone["rank"], alone["class"]) == (0, "signal") and "killed by a signal?" in alone["message"]
    killed = rootcause.root_cause({"world_size": 2, "rc": -15, "interrupted": 15,
                                   "watch": {"gone": {0: {"time": 5.0, "exit_code": -9}}}})
    assert (killed["rank"], killed["class"]) == (0, "signal") and "SIGKILL" in killed["message"]


# ------------------------------------------------------------------------------------------------ stacks

def test_top_frame_is_the_main_threads_innermost_frame():
    text = textwrap.dedent("""\
        Thread 0x00007f2ab33546c0 (most recent call first):
          File "/py/threading.py", line 331 in wait

        Current thread 0x00007f2aebc53b80 (most recent call first):
          File "/w/faults.py", line 91 in after_step
          File "/w/trainer.py", line 365 in train
        """)
    assert top_frame(text, 0x00007F2AEBC53B80) == "/w/faults.py:91 in after_step"
    assert top_frame(text, None) == "/py/threading.py:331 in wait"
    assert top_frame("", 1) is None


def test_injected_exception_and_simulated_cpu_oom():
    import torch

    from ddp_runner.tasks.engine.diagnostics import faults

    saved = faults._active
    try:
        faults.configure({"kind": "exception", "rank": 1, "step": 2,
                          "also": [{"kind": "oom", "rank": 0, "step": 3}]}, env={})
        faults.after_step(1, 1)
        faults.after_step(0, 2)
        with pytest.raises(RuntimeError, match="injected fault on rank 1 at step 2"):
            faults.after_step(1, 2)
        with pytest.raises(torch.OutOfMemoryError, match="simulated on CPU"):
            faults.after_step(0, 3)
        faults.use(saved)
        faults.configure({"kind": "exception", "rank": 1, "step": 2}, env={"TORCHELASTIC_RESTART_COUNT": "1"})
        faults.after_step(1, 2)  # an elastic restart's attempt runs without it
    finally:
        faults.use(saved)


def test_tidy_drops_empty_stack_files(tmp_path):
    stacks = tmp_path / layout.STACKS
    stacks.mkdir(parents=True)
    (stacks / "rank0.txt").write_text("")
    (stacks / ".dump-requested").write_text("")
    diagnostics.tidy(str(tmp_path))
    assert not stacks.exists()
    stacks.mkdir()
    (stacks / "rank1.txt").write_text("Thread 0x1")
    diagnostics.tidy(str(tmp_path))
    assert os.listdir(stacks) == ["rank1.txt"]


def test_tidy_drops_what_a_rank_killed_mid_write_left_and_keeps_the_records(tmp_path):
    """A rank killed in the middle of an atomic write leaves its temporary sibling; once every rank has ended it
    goes (a resumed run's tree holds no temporary file), the records themselves stay."""
    logs = tmp_path / layout.LOGS
    logs.mkdir()
    (logs / "rank1.error.json").write_text("{}")
    (logs / ".rank1.error.json.x1y2.tmp").write_text('{"half')
    (logs / ".rank0.json.abcd.tmp").write_text("")
    diagnostics.tidy(str(tmp_path))
    assert sorted(os.listdir(logs)) == ["rank1.error.json"]


def _memory_run(tmp_path):
    """A remote run tree (fsspec's in-memory store) and a local staging folder, as a node's driver has them."""
    import uuid

    import fsspec

    from ddp_runner.rundir.run_dir import RunDir

    fs, path = fsspec.filesystem("memory"), f"/peers-{uuid.uuid4().hex}"
    diagnostics.prepare(str(tmp_path), {})
    return RunDir(url=f"memory://{path}", local=str(tmp_path), fs=fs, path=path)


def test_node_0_reads_the_other_nodes_progress_from_the_run_tree_and_drops_an_earlier_launchs(tmp_path):
    from ddp_runner.diagnostics.peers import PeerRanks

    rd = _memory_run(tmp_path)
    rd.fs.pipe_file(f"{rd.path}/{layout.rank_progress(1)}", json.dumps({"step": 3, "seq": 9}).encode())
    rd.fs.pipe_file(f"{rd.path}/{layout.rank_progress(2)}", b"{half a rec")
    rd.fs.pipe_file(f"{rd.path}/{layout.DUMP_REQUEST}", b"")
    peers = PeerRanks(rd, every_s=0)
    assert peers.progress([1, 2, 3]) == {1: {"step": 3, "seq": 9}}  # half-written and missing ones are absent
    peers.reset()  # before a launch: the earlier launch's records would be judged as this one's
    assert not rd.fs.exists(f"{rd.path}/{layout.rank_progress(1)}")
    assert not rd.fs.exists(f"{rd.path}/{layout.DUMP_REQUEST}")
    peers.request_dump()
    assert rd.fs.exists(f"{rd.path}/{layout.DUMP_REQUEST}")
    assert peers.stack(1) is None
    rd.fs.pipe_file(f"{rd.path}/{layout.rank_stack(1)}", b"Thread 0x1 (most recent call first):\n")
    assert peers.stack(1).startswith("Thread")


def test_the_mirror_copies_no_empty_stack_placeholder_only_written_stacks(tmp_path):
    """Every rank opens an empty stack file in case it is asked for its stacks: a mirror tick during the run must
    not put those placeholders in a remote tree (tidy removes them locally after the run, not remotely)."""
    from ddp_runner.rundir.mirror import Mirror

    rd = _memory_run(tmp_path)
    (tmp_path / layout.rank_stack(0)).write_text("")
    (tmp_path / layout.rank_log(0)).write_text("step 1\n")
    Mirror(rd, every_s=0).flush()
    assert rd.fs.exists(f"{rd.path}/{layout.rank_log(0)}")
    assert not rd.fs.exists(f"{rd.path}/{layout.rank_stack(0)}")
    (tmp_path / layout.rank_stack(0)).write_text("Thread 0x1 (most recent call first):\n")
    Mirror(rd, every_s=0).flush()
    assert rd.fs.cat_file(f"{rd.path}/{layout.rank_stack(0)}").startswith(b"Thread")


def test_a_mirror_that_could_not_copy_says_where_the_files_stay(tmp_path, monkeypatch):
    from ddp_runner.rundir.mirror import Mirror

    rd = _memory_run(tmp_path)
    (tmp_path / layout.rank_log(0)).write_text("step 1\n")
    (tmp_path / layout.rank_log(1)).write_text("step 1\n")
    mirror = Mirror(rd, every_s=0)
    mirror.flush()
    assert mirror.clean and mirror.left_behind() is None
    (tmp_path / layout.rank_log(0)).write_text("step 2\n")
    (tmp_path / layout.rank_log(1)).write_text("step 2\n")

    def store_gone(*_args, **_kwargs):
        raise ConnectionError("the store is gone")

    monkeypatch.setattr(rd.fs, "put_file", store_gone)
    mirror.flush()
    assert not mirror.clean
    assert mirror.left_behind() == f"ddp-run: 2 file(s) could not be copied into {rd.url}; they stay in {rd.local}"


def test_another_node_relays_the_dump_request_only_once_this_launch_has_trained(tmp_path):
    from ddp_runner.diagnostics.peers import Relay
    from ddp_runner.rundir.mirror import Mirror

    rd = _memory_run(tmp_path)
    local_request = tmp_path / layout.DUMP_REQUEST
    rd.fs.pipe_file(f"{rd.path}/{layout.DUMP_REQUEST}", b"")  # not yet removed by node 0: an earlier launch's
    progress = tmp_path / layout.rank_progress(1)
    progress.write_text(json.dumps({"rank": 1, "step": 4, "start_step": 4, "seq": 2}))
    (tmp_path / layout.rank_stack(1)).write_text("")  # every rank opens one in case it is asked for its stacks
    relay = Relay(rd, Mirror(rd), every_s=0)
    relay.tick()
    assert not local_request.exists()
    assert not rd.fs.exists(f"{rd.path}/{layout.rank_stack(1)}")  # an empty stack file is not copied
    assert json.loads(rd.fs.cat_file(f"{rd.path}/{layout.rank_progress(1)}"))["seq"] == 2  # mirrored at once
    progress.write_text(json.dumps({"rank": 1, "step": 5, "start_step": 4, "seq": 3}))
    relay.tick()
    assert local_request.exists()  # the ranks' progress threads now write their stacks
    (tmp_path / layout.rank_stack(1)).write_text("Thread 0x1 (most recent call first):\n")
    relay.tick()
    assert rd.fs.cat_file(f"{rd.path}/{layout.rank_stack(1)}").startswith(b"Thread")


def test_another_nodes_rank_is_judged_with_the_lag_of_its_copy(tmp_path):
    from ddp_runner.diagnostics.peers import PeerRanks
    from ddp_runner.diagnostics.watchdog import Watchdog

    rd = _memory_run(tmp_path)
    (tmp_path / layout.rank_progress(0)).write_text(json.dumps({"step": 3, "start_step": 0, "phase": "log",
                                                                "seq": 5}))
    rd.fs.pipe_file(f"{rd.path}/{layout.rank_progress(1)}", json.dumps(
        {"step": 3, "start_step": 0, "phase": "step_end", "seq": 4}).encode())
    watch = Watchdog(str(tmp_path), rd.url, 2, 10.0, lambda: None, peers=PeerRanks(rd, every_s=0, lag_s=5.0))
    watch.tick(judge=False)
    assert watch.remote == {1} and sorted(watch.progress) == [0, 1]
    first_seen = watch.seen[0][1]
    assert watch._stale(first_seen + 11) == [0]  # the remote copy may be 5 s behind: not yet
    assert watch._stale(first_seen + 16) == [0, 1]
