"""Root cause when every failure is a consequence: collective
timeouts, lost peers and SIGTERMed ranks are what other ranks see of a failure; when nothing else failed, the
EARLIEST of them is named, whatever its rank or the order the records were written or read in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.local import LocalFileSystem

from ddp_runner.config.plan import Plan
from ddp_runner.contract import layout
from ddp_runner.diagnostics import rootcause
from ddp_runner.rundir.run_dir import RunDir
from ddp_runner.supervise import finalize

T0 = 1_760_000_000.0  # Unix seconds: the records carry wall-clock times


def _err(rank: int, t: float, typ: str, msg: str) -> dict[str, Any]:
    return {"rank": rank, "time": t, "type": typ, "message": msg,
            "traceback": ['  File "/x/loop.py", line 9, in step', f"{typ}: {msg}"]}


TIMEOUT = ("DistBackendError", "[gloo] Timed out waiting 30000ms for recv operation to complete")
PEER_LOST = ("RuntimeError", "Connection reset by peer [127.0.0.1]:29500")


def _evidence(world: int, errors: dict[int, dict[str, Any]], terminated: dict[int, float]) -> dict[str, Any]:
    return {"world_size": world, "rc": 1, "errors": errors,
            "progress": {r: {"step": 4, "phase": "terminated", "since": t} for r, t in terminated.items()},
            "exit_codes": {str(r): -15 for r in terminated}}


@pytest.mark.parametrize(("errors", "terminated", "earliest", "cls"), [
    # rank 0 times out last, rank 1's peer was lost first, rank 2 was stopped in between
    pytest.param({0: (130.0, *TIMEOUT), 1: (100.0, *PEER_LOST)}, {2: 115.0}, 1, "peer_lost", id="lost-peer-first"),
    # the earliest is the last rank, a collective timeout; records listed in neither rank nor time order
    pytest.param({3: (101.0, *TIMEOUT), 0: (140.0, *PEER_LOST), 1: (120.0, *TIMEOUT)}, {2: 160.0}, 3,
                 "collective_timeout", id="last-rank-timeout-first"),
    # the earliest is a rank SIGTERMed before the others' collectives gave up
    pytest.param({1: (150.0, *TIMEOUT), 0: (170.0, *TIMEOUT)}, {3: 190.0, 2: 105.0}, 2, "signal",
                 id="sigterm-first"),
])
def test_the_earliest_consequence_is_named_when_nothing_else_failed(
        errors: dict[int, tuple[float, str, str]], terminated: dict[int, float], earliest: int, cls: str) -> None:
    """Only consequences (timeouts, lost peers, SIGTERM): the root cause is the one with the earliest time, and
    the others follow as consequences in time order."""
    records = {r: _err(r, T0 + t, typ, msg) for r, (t, typ, msg) in errors.items()}
    stopped = {r: T0 + t for r, t in terminated.items()}
    cause = rootcause.root_cause(_evidence(4, records, stopped))
    assert cause is not None
    assert (cause["rank"], cause["class"]) == (earliest, cls), cause
    times = {**{r: rec["time"] for r, rec in records.items()}, **stopped}
    later = sorted((r for r in times if r != earliest), key=lambda r: times[r])
    assert [c["rank"] for c in cause["consequences"]] == later
    assert rootcause.headline(cause).startswith(f"earliest error on rank {earliest} [{cls}]")


def test_finalize_names_the_earliest_consequence_from_the_rank_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The driver's summary.json and closing line name the rank whose consequence error came first, read from the
    rank files (rank 0's record is written last but read first)."""
    run = tmp_path / "run"
    (run / layout.PROGRESS).mkdir(parents=True)
    # Written in time order 2, 1, 0: rank 2 lost its peer first, then rank 1 and rank 0 timed out.
    for rank, t, (typ, msg) in ((2, 10.0, PEER_LOST), (1, 25.0, TIMEOUT), (0, 40.0, TIMEOUT)):
        (run / layout.rank_error(rank)).write_text(json.dumps(_err(rank, T0 + t, typ, msg)))
    (run / layout.rank_progress(3)).write_text(json.dumps({"step": 4, "phase": "terminated", "since": T0 + 30.0}))
    (run / layout.AGENT_LOG).write_text("rank      : 3 (local_rank: 3)\n  exitcode  : -15 (pid: 42)\n")
    rd = RunDir(url=str(run), local=str(run), fs=LocalFileSystem(), path=str(run))
    plan = Plan(world_size=4, per_rank_batch=2, accumulation=1, global_batch=8, device="cpu", backend="gloo",
                nnodes=1, nproc_per_node=4)

    code = finalize.finish(rd, {"versions": {}}, plan, rc=1, interrupted=None)

    assert code == 1
    cause = json.loads((run / layout.SUMMARY).read_text())["root_cause"]
    assert (cause["rank"], cause["class"]) == (2, "peer_lost"), cause
    assert [c["rank"] for c in cause["consequences"]] == [1, 3, 0]
    assert json.loads((run / layout.MANIFEST).read_text())["status"] == layout.STATUS_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("ddp-run: FAILED: earliest error on rank 2 [peer_lost]"), err  # the account leads
    assert sum("earliest error" in line for line in err) == 1, err
