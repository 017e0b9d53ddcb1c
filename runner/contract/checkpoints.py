"""Checkpoint integrity and the resume rule, as the driver and the workers both apply them.

A checkpoint is ``<run>/checkpoints/step_<N>/`` holding ``state.pt`` and the commit marker ``meta.json``, written
last: a step counts only once its marker exists and is valid. It loads only when ``state.pt`` (and every other file
the marker lists, for a sharded checkpoint) has the size the marker records; the workers also compare sha256, the
driver never hashes. A checkpoint resumes at another world size only at the same global batch (the sharded state
is resharded, the data order carries over); another global batch would be another optimisation problem.

Pure functions over what each side has read in its own way (fsspec on the driver, the storage layer on the
workers): names, marker text or fields, sizes and digests in, a verdict out. Standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Mapping
from typing import Any

from ddp_runner.contract import layout

STATE_FILE = layout.CKPT_STATE
MARKER_FILE = layout.CKPT_MARKER
FORMAT = "ddp-runner-checkpoint/1"  # the marker's "format": what the workers write and accept

_STEP_DIR_RE = re.compile(r"^step_(\d+)$")

Marker = str | bytes | Mapping[str, Any]


def step_dir_name(step: int) -> str:
    """The directory name of checkpoint ``step`` (``step_<N>``); refuses anything but a non-negative int."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
    return f"step_{step}"


def step_of(name: str) -> int | None:
    """The step of a checkpoint directory named ``step_<N>``; None for any other name (a temporary sibling)."""
    m = _STEP_DIR_RE.match(name)
    return int(m.group(1)) if m else None


def _fields(marker: Marker) -> dict[str, Any] | None:
    """The marker's JSON object, or None when it is not one."""
    if isinstance(marker, Mapping):
        return dict(marker)
    try:
        fields = json.loads(marker)
    except (ValueError, UnicodeDecodeError):
        return None
    return fields if isinstance(fields, dict) else None


def parse_marker(marker: Marker, step: int | None = None) -> dict[str, Any] | None:
    """The fields of a valid commit marker (its text, or already parsed), else None: the workers' rule for
    whether a checkpoint exists. Valid: this format, an int ``step`` (equal to ``step`` when given) and ``bytes``,
    a str ``sha256``, and ``state_file`` naming ``state.pt``."""
    meta = _fields(marker)
    if meta is None or meta.get("format") != FORMAT:
        return None
    if not isinstance(meta.get("step"), int) or not isinstance(meta.get("bytes"), int):
        return None
    if not isinstance(meta.get("sha256"), str) or meta.get("state_file") != STATE_FILE:
        return None
    if step is not None and meta["step"] != step:
        return None
    return meta


def entry_problem(name: str, is_dir: bool, has_marker: bool) -> str | None:
    """Why entry ``name`` of a checkpoints folder is not a committed checkpoint, as every reader of the folder judges
    it (the workers' resume and retention, ``ddp-export``, the driver before launch): None when it is one, or when
    its name is not ``step_<N>`` at all (a save's temporary sibling, nothing a reader lists). ``is_dir``: whether it
    is a folder; ``has_marker``: whether its ``meta.json`` exists (the workers also check that it is valid:
    :func:`marker_problem`; the driver never reads it)."""
    if step_of(name) is None:
        return None
    if not is_dir:
        return "a file, not a checkpoint folder"
    if not has_marker:
        return f"no {MARKER_FILE}: a save that never committed"
    return None


def link_problem(path: str) -> str | None:
    """Why the entry at local ``path`` of a checkpoints folder is a symbolic link that cannot be followed (it
    points nowhere, or round a loop), named as such rather than as a file; None when it is no link or its target
    exists (then it is judged as what it points at). Local paths only: an object store has no links."""
    try:
        if not stat.S_ISLNK(os.lstat(path).st_mode):
            return None
        target = os.readlink(path)
    except OSError:
        return None
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"a symbolic link that loops back on itself (via {target})"
        return f"a dangling symbolic link: its target {target} does not exist"
    return None


def marker_problem(name: str, marker: Marker) -> str | None:
    """Why the commit marker of checkpoint folder ``name`` does not commit it (:func:`parse_marker`), or None."""
    if parse_marker(marker, step_of(name)) is None:
        return f"its {MARKER_FILE} is not a valid commit marker"
    return None


def commit_problem(name: str, is_dir: bool, marker: Marker | None) -> str | None:
    """Why entry ``name`` of a checkpoints folder is not a committed checkpoint, reading its marker (``marker``: the
    text or fields of its ``meta.json``, None when absent): :func:`entry_problem`, then :func:`marker_problem`. The
    one rule of what a reader lists as a checkpoint, the workers' storage and the driver's listing alike; None for a
    committed one, and for a name that is not ``step_<N>``."""
    if (why := entry_problem(name, is_dir, marker is not None)) is not None or marker is None:
        return why
    return marker_problem(name, marker)


def skipped_note(name: str, why: str) -> str:
    """The note a reader of a checkpoints folder gives for entry ``name`` it passes over (``why``: from
    :func:`entry_problem`), the same words on every side."""
    return f"{layout.CHECKPOINTS}/{name} is not a complete checkpoint ({why}); skipped"


def fallback_warning(name: str, reason: str, taken: str, doing: str = "resuming") -> str:
    """The warning for checkpoint ``name`` passed over (``reason``: its integrity problem) for the older ``taken``:
    a resume's and ``ddp-export``'s alike (``doing``: what is done from ``taken``)."""
    return f"{name} failed its integrity check ({reason}); {doing} from {taken}"


def file_size_problem(name: str, file: str, recorded: int, actual: int | None) -> str | None:
    """Why ``file`` of checkpoint ``name`` does not match its marker (``actual`` None: the file is absent); None
    when its size is the one recorded."""
    if actual is None:
        why = "exists" if file == STATE_FILE else "lists it"
        return f"{name}: {file} is missing although {MARKER_FILE} {why}"
    if actual != recorded:
        return f"{name}: {file} is {actual} bytes, {MARKER_FILE} says {recorded}"
    return None


def size_problem(name: str, marker: Marker | None, state_size: int | None) -> str | None:
    """Why committed checkpoint ``name`` cannot load as far as sizes tell, or None when it passes.

    ``marker``: the text of its ``meta.json`` (or its fields; None: absent), ``state_size``: the size of its
    ``state.pt`` (None: absent). Only the recorded ``bytes`` is read here, so the driver may call it on a marker
    it has read but not validated; the workers also check the marker itself (:func:`parse_marker`).
    """
    if marker is None:
        return f"{name}: {MARKER_FILE} is missing"
    meta = _fields(marker)
    if meta is None or not isinstance(meta.get("bytes"), int):
        return f"{name}: {MARKER_FILE} is not valid"
    return file_size_problem(name, STATE_FILE, meta["bytes"], state_size)


def listed_files(marker: Mapping[str, Any]) -> dict[str, int]:
    """The files a (sharded) checkpoint's marker lists beside ``state.pt``, with their recorded sizes."""
    return dict(marker.get("files") or {})


def digest_problem(name: str, recorded: str, actual: str) -> str | None:
    """Why ``state.pt`` of checkpoint ``name`` is corrupt (its sha256 is not the recorded one), or None."""
    if actual != recorded:
        return f"{name}: sha256 of {STATE_FILE} does not match {MARKER_FILE} (corrupt file)"
    return None


def world_size_change_problem(their_world_size: int | None, their_global_batch: int | None,
                              world_size: int, global_batch: int) -> str | None:
    """Why a checkpoint written at ``their_world_size`` and ``their_global_batch`` cannot resume in a run of
    ``world_size`` and ``global_batch``, or None when it can: the same world size (or an unknown one), or another
    at the same global batch. The caller adds where and what to do."""
    if their_world_size is None or their_world_size == world_size or their_global_batch == global_batch:
        return None
    return (f"it ran with world_size={their_world_size} and global batch {their_global_batch}, this run has"
            f" world_size={world_size} and global batch {global_batch}")
