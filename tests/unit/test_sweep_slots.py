"""Where a concurrent sweep's jobs run (runner/job/slots.py, runner/job/pool.py's pure parts): disjoint device sets,
peer-connected GPUs preferred and a set without said so, how many jobs at once."""

from __future__ import annotations

import pytest

from ddp_runner.config import validate
from ddp_runner.contract.errors import PlanError
from ddp_runner.job.pool import child_argv, device_kind, need_of
from ddp_runner.job.slots import Slots, choose, connected, limit, parse_p2p

# As `nvidia-smi topo -p2p r` prints it on a terminal (underlined header): GPUs 0-1 and 2-3 are NVLink pairs, no
# P2P across the pairs.
P2P = ("\x1b[4m \tGPU0\tGPU1\tGPU2\tGPU3\x1b[0m\n"
       " GPU0\tX\tOK\tNS\tNS\n GPU1\tOK\tX\tNS\tNS\n GPU2\tNS\tNS\tX\tOK\n GPU3\tNS\tNS\tOK\tX\n\n"
       "Legend:\n\n  X    = Self\n  OK   = Status Ok\n  NS   = Not supported\n")


def test_the_p2p_matrix_is_read_into_peer_sets() -> None:
    peers = parse_p2p(P2P)
    assert peers == {0: {1}, 1: {0}, 2: {3}, 3: {2}}
    assert parse_p2p("Failed to run topology") == {}


def test_a_two_gpu_job_gets_a_peer_connected_pair_when_one_is_free() -> None:
    peers = parse_p2p(P2P)
    slots = Slots("gpu", [0, 1, 2, 3], peers)
    slots.busy = {0}  # a 1-GPU job holds GPU 0: {1, 2} is the first free pair, but not connected
    ids, peer = slots.take(2)
    assert ids == [2, 3] and peer is True
    assert connected([1, 2], peers) is False and connected([1, 2], None) is None and connected([5], None) is True


def test_without_a_connected_set_the_job_still_runs_and_the_set_is_marked() -> None:
    slots = Slots("gpu", [0, 1, 2, 3], parse_p2p(P2P))
    slots.busy = {0, 3}
    ids, peer = slots.take(2)
    assert ids == [1, 2] and peer is False


def test_sets_taken_at_the_same_time_are_disjoint_and_come_back_when_given() -> None:
    slots = Slots("cpu", list(range(8)))
    sets = [slots.take(2)[0] for _ in range(4)]
    flat = [i for s in sets for i in s]
    assert len(flat) == len(set(flat)) == 8, sets
    assert not slots.fits(1)
    slots.give(sets[1])
    assert slots.fits(2) and not slots.fits(3)
    assert slots.take(2)[0] == sets[1]


def test_a_job_larger_than_the_machine_waits_for_all_of_it_and_gets_all_of_it() -> None:
    slots = Slots("cpu", [0, 1])
    assert choose([0, 1], 4) == [0, 1]
    slots.busy = {1}
    assert not slots.fits(4)
    slots.give([1])
    assert slots.fits(4) and slots.take(4)[0] == [0, 1]


def test_how_many_jobs_run_at_once() -> None:
    assert limit(False) == limit("false") == limit(1) == 1
    assert limit("auto") is None and limit(True) is None
    assert limit(3) == 3


def test_what_a_job_needs_and_where_it_runs() -> None:
    conf = {"device": "auto", "world_size": 2, "launcher": {"nnodes": 1}, "sweep": {"cores_per_rank": 3}}
    assert device_kind(conf, gpus=0) == "cpu" and device_kind(conf, gpus=2) == "gpu"
    assert device_kind({**conf, "device": "cpu"}, gpus=8) == "cpu"
    assert need_of(conf, "gpu", 8) == 2 and need_of(conf, "cpu", 16) == 6
    assert need_of({**conf, "world_size": "auto"}, "gpu", 8) == 8
    argv = child_argv(["-cd", "conf"], ["train.lr=0.1", "seed=2"])
    assert argv[1:4] == ["-P", "-m", "ddp_runner"] and argv[-4:] == ["-cd", "conf", "train.lr=0.1", "seed=2"]


@pytest.mark.parametrize("value", ["auto", 2, False])
def test_sweep_parallel_takes_auto_a_number_or_false(value: object) -> None:
    validate.check_engine({"sweep": {"parallel": value}})


@pytest.mark.parametrize("value", [0, True, "fast", 1.5])
def test_sweep_parallel_refuses_anything_else_naming_the_key(value: object) -> None:
    with pytest.raises(PlanError) as err:
        validate.check_engine({"sweep": {"parallel": value}})
    assert err.value.key == "sweep.parallel" and "auto" in err.value.fix
