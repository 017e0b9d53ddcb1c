"""Checkpoint storage: round trips (local, memory://, a real S3 server), crash atomicity, retention, async
saves, refusal of unsafe pickles, RNG state."""

from __future__ import annotations

import hashlib
import random
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch

from ddp_runner.tasks.engine import checkpoint as ck
from ddp_runner.tasks.engine.checkpoint import storage


@pytest.fixture(params=["local", "memory", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh checkpoint root on each kind of filesystem."""
    if request.param == "local":
        return str(tmp_path / "checkpoints")
    if request.param == "memory":
        return f"memory://ckpt-{uuid.uuid4().hex[:12]}/checkpoints"
    return request.getfixturevalue("s3_url") + "/checkpoints"


def _state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(64, 32, generator=g), "b": torch.zeros(32), "n": torch.tensor(step)},
        "optim": {"state": {0: {"exp_avg": torch.randn(64, 32, generator=g),
                                "step": torch.tensor(float(step))}},
                  "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0], "fused": None}]},
        "step": step,
        "py_rng": random.getstate(),
        "meta": {"name": "run", "flag": True, "nested": [1, 2.5, "x", None, (3, (4, 5))]},
    }


def _assert_same(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        assert a == b and type(a) is type(b)


def _names(root: str) -> set[str]:
    fs, path = fsspec.core.url_to_fs(root)
    fs.invalidate_cache(path)
    try:
        return {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)}
    except FileNotFoundError:
        return set()


# ------------------------------------------------------------------------------------------ round trip


def test_round_trip(root: str) -> None:
    assert ck.latest(root) is None and ck.list_complete(root) == []
    state = _state(7)
    url = ck.save(root, 7, state, keep_last=3)
    assert url == f"{root}/step_7"
    assert ck.list_complete(root) == [(7, url)]
    assert ck.latest(root) == url
    assert ck.is_checkpoint(url) and ck.is_checkpoint(url + "/state.pt")
    _assert_same(state, ck.load(url))
    _assert_same(state, ck.load(url + "/state.pt"))
    # random.getstate() is a tuple of ints and must come back as one, usable as is.
    random.setstate(ck.load(url)["py_rng"])
    assert _names(root) == {"step_7"}


def test_missing_incomplete_and_corrupt_are_refused(tmp_path: Path) -> None:
    root = str(tmp_path / "ck")
    with pytest.raises(ck.CheckpointError, match="not a complete checkpoint"):
        ck.load(f"{root}/step_3")
    url = ck.save(root, 3, _state(3), keep_last=0)
    state_pt = Path(url) / "state.pt"
    data = bytearray(state_pt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state_pt.write_bytes(bytes(data))
    with pytest.raises(ck.CheckpointError, match="sha256"):
        ck.load(url)
    state_pt.write_bytes(bytes(data) + b"x")
    with pytest.raises(ck.CheckpointError, match="bytes"):
        ck.load(url)
    (Path(url) / "meta.json").unlink()
    assert not ck.is_checkpoint(url) and ck.latest(root) is None
    with pytest.raises(ck.CheckpointError, match="not a complete checkpoint"):
        ck.load(url)


def test_saving_an_existing_step_replaces_it(root: str) -> None:
    ck.save(root, 4, _state(1), keep_last=0)
    url = ck.save(root, 4, _state(2), keep_last=0)
    _assert_same(_state(2), ck.load(url))
    assert _names(root) == {"step_4"}


def test_cleanup_partial_keeps_newer_leftovers(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    ck.save(str(root), 5, _state(5), keep_last=0)
    (root / "step_4.tmp-abc123").mkdir()
    (root / "step_3").mkdir()  # an uncommitted object-store-style dir
    (root / "step_3" / "state.pt").write_bytes(b"partial")
    (root / "step_9.tmp-def456").mkdir()  # newer than the newest complete: could be in flight elsewhere
    (root / "notes.txt").write_text("not ours")
    assert sorted(ck.cleanup_partial(str(root))) == ["step_3", "step_4.tmp-abc123"]
    assert _names(str(root)) == {"step_5", "step_9.tmp-def456", "notes.txt"}


# ------------------------------------------------------------------------------------------- retention


def test_keep_last_protect_and_partials_not_counted(root: str) -> None:
    first = ck.save(root, 1, _state(1), keep_last=2)
    protect = frozenset({first})
    ck.save(root, 2, _state(2), keep_last=2, protect=protect)
    # A partial checkpoint (no meta.json) must not count towards keep_last.
    fs, path = fsspec.core.url_to_fs(root)
    fs.makedirs(f"{path}/step_3", exist_ok=True)
    fs.pipe_file(f"{path}/step_3/state.pt", b"partial")
    ck.save(root, 4, _state(4), keep_last=2, protect=protect)
    assert [s for s, _ in ck.list_complete(root)] == [1, 2, 4]
    assert "step_3" not in _names(root)  # removed: older than the newest complete one
    ck.save(root, 5, _state(5), keep_last=2, protect=protect)
    ck.save(root, 6, _state(6), keep_last=2, protect=protect)
    assert [s for s, _ in ck.list_complete(root)] == [1, 5, 6]  # step 1 is protected, beyond the 2 kept
    _assert_same(_state(1), ck.load(first))
    ck.save(root, 7, _state(7), keep_last=1)  # protection is per call
    assert [s for s, _ in ck.list_complete(root)] == [7]


def test_keep_last_zero_keeps_all(tmp_path: Path) -> None:
    root = str(tmp_path / "ck")
    for step in (1, 2, 3):
        ck.save(root, step, {"step": step}, keep_last=0)
    assert [s for s, _ in ck.list_complete(root)] == [1, 2, 3]


# ------------------------------------------------------------------------------------------ async save


def test_async_saver_round_trip_and_snapshot_isolation(tmp_path: Path) -> None:
    root = str(tmp_path / "ck")
    w = torch.zeros(1000)
    tied = {"a": w, "b": w}  # one tensor reachable twice, like tied embeddings
    with ck.AsyncSaver() as saver:
        for step in (1, 2, 3):
            w.fill_(float(step))
            url = saver.save(root, step, {"model": tied, "step": step, "t": (step, "x")}, keep_last=2)
            w.fill_(-1.0)  # training goes on: must not leak into the snapshot being written
            assert url == f"{root}/step_{step}"
        saver.wait()
        assert saver.last_url == f"{root}/step_3"
    assert [s for s, _ in ck.list_complete(root)] == [2, 3]
    loaded = ck.load(f"{root}/step_3")
    assert torch.equal(loaded["model"]["a"], torch.full((1000,), 3.0)) and loaded["t"] == (3, "x")
    # Aliasing is kept, as torch.save would keep it.
    assert loaded["model"]["a"].data_ptr() == loaded["model"]["b"].data_ptr()
    assert torch.equal(ck.load(f"{root}/step_2")["model"]["b"], torch.full((1000,), 2.0))


def test_async_saver_surfaces_background_errors(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    bad_root = str(blocker / "ck")
    saver = ck.AsyncSaver()
    saver.save(bad_root, 1, {"w": torch.ones(3)}, keep_last=0)  # returns; the failure is in the background
    with pytest.raises(ck.CheckpointError, match="background save of .*step_1 failed"):
        saver.wait()
    saver.wait()  # reported once

    saver.save(bad_root, 2, {"w": torch.ones(3)}, keep_last=0)
    with pytest.raises(ck.CheckpointError, match="step_2"):  # the next save() raises the earlier failure
        saver.save(str(tmp_path / "good"), 3, {"w": torch.ones(3)}, keep_last=0)
    saver.save(str(tmp_path / "good"), 3, {"w": torch.ones(3)}, keep_last=0)
    saver.close()
    assert ck.latest(str(tmp_path / "good")) == f"{tmp_path / 'good'}/step_3"


# --------------------------------------------------------------------------------------------- safety


class _Evil:
    """Its pickle runs code on load (the classic attack on torch.load without weights_only)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def _write_committed(dir_path: Path, step: int, payload: dict) -> None:
    dir_path.mkdir(parents=True)
    torch.save(payload, dir_path / "state.pt")
    data = (dir_path / "state.pt").read_bytes()
    (dir_path / "meta.json").write_bytes(storage._meta_bytes(step, len(data), hashlib.sha256(data).hexdigest()))


def test_malicious_pickle_is_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "ck" / "step_1"
    _write_committed(ckpt, 1, {"w": torch.ones(2), "evil": _Evil(marker)})
    assert ck.is_checkpoint(str(ckpt))  # well-formed and committed: only its content is the problem
    for url in (str(ckpt), str(ckpt / "state.pt")):
        with pytest.raises(ck.CheckpointError, match="refused for safety") as exc:
            ck.load(url)
        assert "state.pt" in str(exc.value) and "arbitrary code" in str(exc.value)
    assert not marker.exists()
    # Control: the file really is an exploit when loaded unsafely.
    torch.load(ckpt / "state.pt", weights_only=False)
    assert marker.exists()


# ------------------------------------------------------------------------------------------------ RNG


def _draws() -> tuple:
    return random.random(), random.getrandbits(64), np.random.rand(3).tolist(), np.random.randn(), \
        torch.rand(4).tolist(), torch.randint(0, 1000, (3,)).tolist()


def test_rng_state_round_trip(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # leave a cached gaussian in numpy's state
    url = ck.save(str(tmp_path / "ck"), 1, {"rng": ck.rng_state()}, keep_last=0)
    expected = _draws()
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    assert _draws() != expected
    ck.set_rng_state(ck.load(url)["rng"])  # through a weights_only load
    assert _draws() == expected


def test_reserve_allocates_the_buffers_the_first_save_uses(tmp_path: Path) -> None:
    model = torch.nn.Linear(64, 32)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    saver = ck.AsyncSaver()
    saver.reserve(state)
    saver.wait()
    reserved = {k: v.data_ptr() for k, v in saver._pool.items()}
    assert ("model", "weight") in reserved and ("optimizer", "state", 0, "exp_avg") in reserved
    opt.step()  # training goes on after the reservation
    url = saver.save(str(tmp_path / "ck"), 2, state, keep_last=1)
    saver.wait()
    # The save copied into the reserved buffers instead of allocating new ones, and saved current values.
    assert {k: v.data_ptr() for k, v in saver._pool.items() if k in reserved} == reserved
    loaded = ck.load(url)
    assert torch.equal(loaded["model"]["weight"], model.weight.detach())
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    saver.close()
