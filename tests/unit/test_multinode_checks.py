"""Multi-node checks before a node's ranks start (issue 30): node 0's rendezvous port already in use, and a
joining node whose config differs from node 0's (named key by key)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ddp_runner.contract import layout
from ddp_runner.contract.errors import PlanError
from ddp_runner.launch import multinode
from ddp_runner.launch.base import Job
from ddp_runner.rundir.run_dir import open_run_dir
from ddp_runner.rundir.status import this_driver

LAUNCHER = {"name": "multinode", "nnodes": 2, "node_rank": 0, "rdzv_id": "exp1", "max_restarts": 0,
            "local_addr": None, "join_timeout_s": 5}


def test_node0_refuses_an_endpoint_already_in_use_and_leaves_nothing(tmp_path: Path) -> None:
    plan = type("P", (), {"world_size": 2})()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        conf = {"launcher": {**LAUNCHER, "rdzv_endpoint": f"127.0.0.1:{port}"}, "task": {"name": "smoke"},
                "output": {"root": str(tmp_path)}}
        with pytest.raises(PlanError) as err:
            multinode.LAUNCHER.open(Job(conf, plan, 0.0))  # type: ignore[arg-type]
        assert err.value.key == "launcher.rdzv_endpoint" and f"port {port} is already in use" in err.value.problem
        assert f"pid {os.getpid()}" in err.value.problem  # who holds it, where this process may see it
        assert list(tmp_path.iterdir()) == [], "no run directory left behind"
    multinode.check_endpoint_free("127.0.0.1", port, f"127.0.0.1:{port}")  # free again


def _conf(lr: float, per_rank: int, node_rank: int, root: Path) -> dict:
    return {"world_size": 4, "batch": {"per_rank": per_rank}, "train": {"lr": lr, "betas": [0.9, 0.95]},
            "data": {"path": "http://u:***@h/x"}, "output": {"root": str(root)}, "dry_run": False,
            "task": {"name": "smoke"}, "launcher": {**LAUNCHER, "node_rank": node_rank, "rdzv_endpoint": "h:1"}}


def test_a_node_with_another_config_is_refused_naming_the_keys(tmp_path: Path) -> None:
    node0 = _conf(1e-4, 4, 0, tmp_path)
    run = tmp_path / "exp1_smoke_w4"
    (run / layout.NODES).mkdir(parents=True)
    (run / layout.CONFIG).write_text(OmegaConf.to_yaml(OmegaConf.create(node0)))
    (run / layout.MANIFEST).write_text(json.dumps({"status": "running", "plan": {}, "driver": this_driver()}))
    plan = type("P", (), {"world_size": 4})()
    mine = _conf(0.01, 2, 1, tmp_path)
    job = Job(mine, plan, 0.0, written=mine)  # type: ignore[arg-type]
    with pytest.raises(PlanError) as err:
        multinode.LAUNCHER.join(job)
    text = err.value.problem
    assert "differs from node 0's (2 keys" in text and "batch.per_rank: node 0 4, this node 2" in text, text
    assert "train.lr: node 0 0.0001, this node 0.01" in text and "launcher.node_rank" not in text
    record = json.loads((run / layout.node_record("1")).read_text())
    assert record["status"] == "refused" and "differs from node 0" in record["reason"]
    # The same config (only the per-node keys differ): no refusal from the comparison.
    multinode.check_same_config(open_run_dir(str(run)), _conf(1e-4, 4, 1, tmp_path))
