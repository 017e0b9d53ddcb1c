"""Saving a checkpoint step that already exists (storage.py), on object stores (``memory://`` and a real S3 server,
moto on loopback) and on a local disk.

Object stores have no atomic rename: the old step is un-committed before its files are overwritten, so while the
new state is being written (or after a crash in that window) the old step is not a checkpoint and the step before
it is the latest complete one. On a local disk the new step is written beside the old one and swapped in by a
rename: the old step stays whole and loadable until then. Either way, once the replacement is committed, no file of
the replaced step remains.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch

from ddp_runner.tasks.engine import checkpoint as ck
from ddp_runner.tasks.engine.checkpoint import storage

OLD_SHARDS = {"shards/__0_0.distcp": b"old rank 0 shard", "shards/__1_0.distcp": b"old rank 1 shard"}
NEW_SHARDS = {"shards/__0_0.distcp": b"new rank 0 shard, one rank only"}
CKPT_FILES = {ck.STATE_FILE, ck.META_FILE}


class _Crash(Exception):
    """Stands for the saving process dying between its payload and its commit."""


@pytest.fixture(params=["memory", "s3", "local"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(kind, checkpoint root URL) on each kind of storage."""
    if request.param == "local":
        return "local", str(tmp_path / "ckpt")
    if request.param == "memory":
        return "memory", f"memory://replace-{tmp_path.name}/ckpt"
    return "s3", request.getfixturevalue("s3_url") + "/ckpt"


def _files(url: str) -> set[str]:
    """Every file under a checkpoint directory, relative to it."""
    fs, path = fsspec.core.url_to_fs(url)
    path = path.rstrip("/")
    fs.invalidate_cache()
    if not fs.exists(path):
        return set()
    return {p[len(path) + 1:] for p in fs.find(path)}


def _entries(root: str) -> set[str]:
    fs, path = fsspec.core.url_to_fs(root)
    fs.invalidate_cache()
    return {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path.rstrip("/"), detail=False)}


def _save(root: str, step: int, value: int, shards: dict[str, bytes] | None) -> str:
    """A plain save (rank 0's state only), or a sharded one whose other files ``shards`` are staged first."""
    state = {"v": torch.tensor([value]), "w": torch.full((1024,), float(value))}
    if shards is None:
        return ck.save(str(root), step, state, keep_last=0, hooks=_hooks)
    staged = storage.stage_dir(root, step)
    _during_write()  # the hook the test installs (a no-op outside the replacement)
    for rel, data in shards.items():
        with fsspec.open(f"{staged}/{rel}", "wb", auto_mkdir=True) as f:
            f.write(data)
    return ck.save(root, step, state, keep_last=0, staged=staged, hooks=_hooks)


_probe: list[Callable[[], None]] = []
_commit_probe: list[Callable[[int, str], None]] = []


class _Hooks:
    """The save path's one hook point (storage.SaveHooks), held between the payload and the commit marker."""

    def before_commit(self, step: int, url: str) -> None:
        for p in _commit_probe:
            p(step, url)


_hooks = _Hooks()


def _during_write() -> None:
    for p in _probe:
        p()


def _assert_old_step_is_not_in_use(kind: str, root: str, old_files: set[str]) -> None:
    """Mid-replacement: what a resume would see."""
    step_2 = f"{root}/step_2"
    if kind == "local":
        # Written beside it, swapped in by a rename: the old step_2 is still whole, its own files, its own state.
        assert [s for s, _ in ck.list_complete(root)] == [1, 2]
        assert _files(step_2) == old_files
        assert ck.load(step_2)["v"].item() == 2
        return
    assert [s for s, _ in ck.list_complete(root)] == [1], "the step being replaced still counts as complete"
    assert ck.latest(root) == f"{root}/step_1"
    assert not ck.is_checkpoint(step_2)
    with pytest.raises(ck.CheckpointError, match="not a complete checkpoint"):
        ck.load(step_2)
    assert ck.load(ck.latest(root))["v"].item() == 1


def _install_probes(monkeypatch: pytest.MonkeyPatch, check: Callable[[], None], crash: bool) -> list[str]:
    """Run ``check`` when the payload starts being written, before the commit marker (and after staging)."""
    seen: list[str] = []
    real_save = torch.save

    def save_payload(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        check()
        seen.append("payload")
        real_save(obj, f, *args, **kwargs)

    def before_commit(step: int, url: str) -> None:
        check()
        seen.append("commit")
        if crash:
            raise _Crash(url)

    def after_stage() -> None:
        check()
        seen.append("stage")

    monkeypatch.setattr(storage.torch, "save", save_payload)
    _commit_probe.append(before_commit)
    _probe.append(after_stage)
    return seen


@pytest.fixture(autouse=True)
def _no_probe() -> Any:
    yield
    _probe.clear()
    _commit_probe.clear()


@pytest.mark.parametrize("new", ["plain", "sharded"])
def test_replacing_a_step_never_shows_the_old_one_as_complete_and_leaves_none_of_its_files(
        backend: tuple[str, str], new: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replacing step_2: mid-write it is not complete on an object store (step_1 is the latest; locally the old one
    stays whole until the rename), and afterwards step_2 holds exactly the new save's files."""
    kind, root = backend
    _save(root, 1, 1, None)
    old = _save(root, 2, 2, OLD_SHARDS)  # a 2-rank sharded save: files a later save may not write again
    old_files = CKPT_FILES | set(OLD_SHARDS)
    assert _files(old) == old_files

    shards = NEW_SHARDS if new == "sharded" else None
    seen = _install_probes(monkeypatch, lambda: _assert_old_step_is_not_in_use(kind, root, old_files), crash=False)
    url = _save(root, 2, 20, shards)
    monkeypatch.undo()
    assert seen == (["stage"] if new == "sharded" else []) + ["payload", "commit"]

    assert url == f"{root}/step_2"
    assert [s for s, _ in ck.list_complete(root)] == [1, 2] and ck.latest(root) == url
    assert ck.load(url)["v"].item() == 20
    assert _files(url) == CKPT_FILES | set(shards or {}), "a file of the replaced step_2 remains"
    assert _entries(root) == {"step_1", "step_2"}  # no moved-aside or temporary copy either


@pytest.mark.parametrize("new", ["plain", "sharded"])
def test_a_crash_while_replacing_a_step_falls_back_to_the_step_before(
        backend: tuple[str, str], new: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save of an existing step that dies before its commit: on an object store the half-replaced step is never
    listed nor loadable and step_1 is the latest; locally the old step_2 is intact. Saving it again cleans up."""
    kind, root = backend
    _save(root, 1, 1, None)
    _save(root, 2, 2, OLD_SHARDS)
    old_files = CKPT_FILES | set(OLD_SHARDS)

    shards = NEW_SHARDS if new == "sharded" else None
    _install_probes(monkeypatch, lambda: None, crash=True)
    with pytest.raises(_Crash):
        _save(root, 2, 20, shards)
    monkeypatch.undo()
    _probe.clear()
    _commit_probe.clear()

    _assert_old_step_is_not_in_use(kind, root, old_files)
    # The run resumes from the latest complete checkpoint and saves step 2 again.
    url = _save(root, 2, 21, shards)
    assert [s for s, _ in ck.list_complete(root)] == [1, 2]
    assert ck.load(ck.latest(root))["v"].item() == 21
    assert _files(url) == CKPT_FILES | set(shards or {})
    assert _entries(root) == {"step_1", "step_2"}
