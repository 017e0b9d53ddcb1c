"""The launchers' pure parts: node counts in the plan, each launcher's command and refusals, the Slurm script,
and where a store listens. No process is started."""

from __future__ import annotations

import json
import signal
import tempfile

import pytest
from test_plan import cfg

from ddp_runner.config.plan import make_plan, node_range
from ddp_runner.contract import netbind
from ddp_runner.contract.errors import PlanError
from ddp_runner.launch import local, multinode, multinode_nodes, multinode_rdzv, slurm
from ddp_runner.launch.registry import launcher_check

MN = {"name": "multinode", "nnodes": 2, "nproc_per_node": None, "node_rank": 0, "rdzv_endpoint": "127.0.0.1:29400",
      "rdzv_id": "exp1", "local_addr": None, "max_restarts": 0}


def test_node_ranges_and_processes_per_node():
    assert node_range(cfg(launcher={"name": "multinode", "nnodes": "1:2"})) == (1, 2)
    assert node_range(cfg(launcher={"name": "multinode", "nnodes": 2})) == (2, 2)
    plan = make_plan(cfg(world_size=4, launcher={"name": "multinode", "nnodes": 2}), [])
    assert (plan.nnodes, plan.nproc_per_node) == (2, 2)
    for bad in ("2:1", "a:b", 0, True):
        with pytest.raises(PlanError) as e:
            node_range(cfg(launcher={"name": "multinode", "nnodes": bad}))
        assert e.value.key == "launcher.nnodes"
    with pytest.raises(PlanError, match="elastic node ranges need launcher=multinode"):
        node_range(cfg(launcher={"name": "slurm", "nnodes": "1:2"}))


def test_world_size_must_be_nodes_times_processes():
    with pytest.raises(PlanError) as e:
        make_plan(cfg(world_size=4, launcher={"name": "multinode", "nnodes": 2, "nproc_per_node": 1}), [])
    assert e.value.key == "world_size" and "2 × 1" in e.value.problem and "world_size=2" in e.value.fix
    with pytest.raises(PlanError) as e:
        make_plan(cfg(launcher={"name": "local", "nnodes": 2}), [])
    assert e.value.key == "launcher.nnodes" and "launcher=multinode" in e.value.fix


def test_local_command_is_a_c10d_rendezvous_on_loopback():
    plan = make_plan(cfg(), [])
    cmd = local.command(plan, {"name": "local", "max_restarts": 1}, "/runs/r")
    assert cmd[1:4] == ["-P", "-m", "ddp_runner.launch.agent"] and "--standalone" not in cmd
    assert {"--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1", "--nnodes=1",
            "--nproc-per-node=2", "--max-restarts=1"} <= set(cmd)
    assert cmd[-3:] == ["-m", "ddp_runner.tasks", "/runs/r"]


def test_multinode_command_and_refusals():
    plan = make_plan(cfg(launcher={"name": "multinode", "nnodes": 2}), [])
    cmd = multinode.command(plan, MN, "/shared/exp1_smoke_w2")
    assert {"--nnodes=2", "--nproc-per-node=1", "--rdzv-endpoint=127.0.0.1:29400", "--rdzv-id=exp1",
            "--rdzv-conf=is_host=true", "--local-addr=127.0.0.1"} <= set(cmd)
    assert "--rdzv-conf=is_host=false" in multinode.command(plan, {**MN, "node_rank": 1}, "/r")
    remote = multinode.command(plan, {**MN, "rdzv_endpoint": "node0.example:29400"}, "/r")
    assert not any(a.startswith("--local-addr") for a in remote), "a cluster node uses its own name"
    assert multinode.env(MN)["GLOO_SOCKET_IFNAME"] == local.loopback_interface()
    assert "GLOO_SOCKET_IFNAME" not in multinode.env({**MN, "rdzv_endpoint": "node0.example:29400"})
    for over, key in (({"rdzv_endpoint": "???"}, "launcher.rdzv_endpoint"), ({"rdzv_id": None}, "launcher.rdzv_id"),
                      ({"rdzv_endpoint": "node0"}, "launcher.rdzv_endpoint"), ({"rdzv_id": "a/b"}, "launcher.rdzv_id"),
                      ({"node_rank": 2}, "launcher.node_rank")):
        with pytest.raises(PlanError) as e:
            launcher_check({**MN, **over})
        assert e.value.key == key


def test_an_elastic_range_passes_its_last_call_to_the_rendezvous():
    plan = make_plan(cfg(launcher={"name": "multinode", "nnodes": "1:2"}), [])
    cmd = multinode.command(plan, {**MN, "nnodes": "1:2", "last_call_s": 3}, "/r")
    assert "--rdzv-conf=is_host=true,last_call_timeout=3" in cmd
    default = multinode.command(plan, {**MN, "nnodes": "1:2"}, "/r")
    assert f"--rdzv-conf=is_host=true,last_call_timeout={multinode_rdzv.LAST_CALL_S}" in default
    fixed = multinode.command(make_plan(cfg(launcher={"name": "multinode", "nnodes": 2}), []),
                              {**MN, "last_call_s": 3}, "/r")
    assert "--rdzv-conf=is_host=true" in fixed and not any("last_call" in a for a in fixed)  # no range: no last call


def test_every_node_computes_the_same_run_directory():
    plan = make_plan(cfg(launcher={"name": "multinode", "nnodes": 2}), [])
    conf = {"launcher": MN, "task": {"name": "smoke"}, "output": {"root": "s3://bucket/runs/"}}
    assert multinode.run_url(conf, plan) == "s3://bucket/runs/exp1_smoke_w2"


def test_failed_node_prefers_a_lost_agent_over_a_peer_that_exited():
    nodes = {"0": {"host": "a", "ended": "t", "torchrun_exit_code": 1},
             "1": {"host": "b", "ended": "t", "torchrun_exit_code": -9}}
    assert (multinode_nodes.failed_node(nodes, {})["message"]
            == "node 1 (host b): its torchrun agent was killed by signal 9")
    nodes["1"] = {"host": "b"}  # its driver never recorded an end
    assert multinode_nodes.failed_node(nodes, {})["node"] == "1"
    assert multinode_nodes.failed_node({"0": {"ended": "t", "torchrun_exit_code": 0}}, {}) is None


def test_slurm_script_and_command():
    launcher = {"name": "slurm", "nodes": 2, "gpus_per_node": 8, "cpus_per_task": None, "partition": "gpu",
                "time": "01:00:00", "account": "proj", "sbatch": ["--qos=high"], "rdzv_port": 29500,
                "requeue": True, "max_restarts": 0}
    launcher_check(launcher)
    text = slurm.script("/shared/run", "/shared/run", launcher, "ddp-smoke")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --time=01:00:00", "#SBATCH --account=proj",
                 "#SBATCH --qos=high", "#SBATCH --requeue", "-m ddp_runner.launch.slurm /shared/run"):
        assert line in text
    assert "cpus-per-task" not in text
    # The pre-emption signal (checkpoint.stop_signal) before the time limit, to the job's driver (B:)
    assert "#SBATCH --signal=B:USR2@120" in slurm.script("/r", "/r", launcher, "x", signal.SIGUSR2)
    assert "#SBATCH --signal=B:TERM@300" in slurm.script("/r", "/r", {**launcher, "signal_before_s": 300}, "x")
    plan = make_plan(cfg(world_size=2, launcher={"name": "slurm", "nnodes": 2}), [])
    cmd = slurm.command(plan, launcher, "/shared/run", head="10.0.0.1", job_id="1234")
    assert cmd[:5] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert "--rdzv-endpoint=10.0.0.1:29734" in cmd and "--nproc-per-node=1" in cmd
    with pytest.raises(PlanError) as e:
        launcher_check({**launcher, "sbatch": ["qos=high"]})
    assert e.value.key == "launcher.sbatch"
    launcher_check(launcher, "/shared/runs")
    launcher_check({**launcher, "nodes": 1}, "s3://bucket/runs")  # one node: its staging folder is the job's
    with pytest.raises(PlanError) as e:  # the other nodes could not write their ranks' files
        launcher_check(launcher, "s3://bucket/runs")
    assert e.value.key == "output.root" and "launcher=multinode" in e.value.fix


def test_a_store_listens_on_the_address_its_clients_use():
    assert netbind.listen_address("127.0.0.1") == "127.0.0.1"
    assert netbind.listen_address("localhost") in ("127.0.0.1", "::1")
    assert netbind.listen_address("no-such-host.invalid") is None  # then all interfaces, and it says so
    sock = netbind.bound_socket("127.0.0.1", 0)
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


def test_the_agents_event_names_are_the_ones_torch_would_give(monkeypatch):
    # The agent replaces torchrun's inspect.stack()-based caller lookup with a frame read (runner/launch/agent.py).
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from ddp_runner.launch import agent

    torchs = dynamic_rendezvous.get_method_name
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", torchs)  # restored after the test
    agent._cheap_caller_names()
    cheap = dynamic_rendezvous.get_method_name
    assert cheap is not torchs

    def recorded_event() -> tuple[str, str, str, str]:
        return torchs(), cheap(), torchs(depth=1), cheap(depth=1)

    def next_rendezvous() -> tuple[str, str, str, str]:
        return recorded_event()

    assert next_rendezvous() == ("next_rendezvous", "next_rendezvous", "recorded_event", "recorded_event")
    assert torchs(depth=10_000) == cheap(depth=10_000) == "no_method_name"


def test_a_rank_stopped_while_writing_its_error_file_does_not_end_the_agent(tmp_path):
    # CI: rank 0, stopped by the agent after its peer was killed, left an empty error file; torch's parser raised
    # in the agent's poll, the agent died, and the elastic restart never came.
    from ddp_runner.launch.forkserver import stopped_rank_failure

    half = tmp_path / "error.json"
    half.write_text('{"message": {"message": "Runt')
    for content in ("", half.read_text()):
        half.write_text(content)
        failure = stopped_rank_failure(0, 1234, -15, str(half))
        assert failure.exitcode == -15 and failure.local_rank == 0 and "Signal 15" in failure.message
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps({"message": {"message": "RuntimeError: peer lost", "extraInfo": {"timestamp": "7"}}}))
    failure = stopped_rank_failure(0, 1234, 1, str(whole))
    assert failure.message["message"] == "RuntimeError: peer lost" and failure.timestamp == 7
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    with pytest.raises(ValueError):  # what the agent met: torch's own parser on a half-written file
        ProcessFailure(local_rank=0, pid=1234, exitcode=-15, error_file=str(half))


def test_the_agents_folder_leaves_room_for_the_forkserver_socket(monkeypatch, tmp_path):
    # A deep TMPDIR (pytest's tmp_path under it) made the forkserver's bind fail: "AF_UNIX path too long".
    from ddp_runner.supervise import agent_dir

    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    moved = agent_dir.temp_dir(4194304)
    assert moved == "/tmp/ddp-run-agent-4194304"
    assert len(f"{moved}/pymp-abcdefgh/listener-abcdefgh") <= 107
    monkeypatch.setattr(tempfile, "tempdir", "/var/tmp")
    assert agent_dir.temp_dir(4194304) == "/var/tmp/ddp-run-agent-4194304"
