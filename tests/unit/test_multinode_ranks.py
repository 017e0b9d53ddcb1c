"""launcher=multinode on one machine: two node agents (2 nodes × 1 rank, gloo) joined by a c10d rendezvous on
loopback, each started by its own ``ddp-run`` with the same command line; and where a job's stores listen."""

from __future__ import annotations

import json


def test_the_ranks_that_ran_come_from_the_newest_launch_not_the_files_left_behind(tmp_path):
    from ddp_runner.launch.multinode_nodes import ranks_that_ran

    def facts(rank: int, world: int, written: float) -> str:
        path = tmp_path / f"rank{rank}.json"
        path.write_text(json.dumps({"rank": rank, "world_size": world, "written": written}))
        return str(path)

    # An earlier launch on two nodes wrote ranks 0-3; this one, on one node, rewrote ranks 0 and 1.
    files = [facts(0, 2, 200.0), facts(1, 2, 201.0), facts(2, 4, 100.0), facts(3, 4, 101.0)]
    assert ranks_that_ran(files) == 2
    old = tmp_path / "rank4.json"
    old.write_text(json.dumps({"rank": 4}))  # a file from before world_size was recorded
    assert ranks_that_ran([str(old)]) == 1
