"""Where a checkpoint lives: the names of its files, the filesystem and path of a URL (any fsspec URL), the URL of
a step, and the error every part of checkpoint storage raises (``storage.py`` says how a save commits)."""

from __future__ import annotations

import os

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ddp_runner.contract import checkpoints as rules

STATE_FILE = rules.STATE_FILE
META_FILE = rules.MARKER_FILE
FORMAT = rules.FORMAT


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt, unsafe to unpickle, or could not be written."""


def fs_of(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem of ``url`` and its path there, without a trailing slash."""
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path.rstrip("/") or path


def is_local_fs(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` is a local (or mounted shared) filesystem, where a save commits by a rename."""
    return isinstance(fs, LocalFileSystem)


def join_url(root_url: str, name: str) -> str:
    """``name`` under ``root_url``, keeping the caller's spelling of the root (relative path, file://, s3://) in the
    URLs returned."""
    return root_url.rstrip("/") + "/" + name


step_dir_name = rules.step_dir_name


def step_url(ckpt_root: str, step: int) -> str:
    """URL of checkpoint ``step`` under ``ckpt_root`` (complete or not)."""
    return join_url(ckpt_root, step_dir_name(step))


def is_local(url: str) -> bool:
    """Whether ``url`` is on a local (or mounted shared) filesystem, where a save is committed by a rename."""
    return is_local_fs(fs_of(url)[0])


def split_ckpt_url(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(fs, checkpoint dir path) for a checkpoint dir URL or its state.pt URL."""
    fs, path = fs_of(url)
    if path.rsplit("/", 1)[-1] == STATE_FILE:
        path = path.rsplit("/", 1)[0]
    return fs, path


def fsync_dir(path: str) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
