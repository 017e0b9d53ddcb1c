"""Reading a W&B offline run (``run-<id>.wandb``) back, record by record, as W&B's own protobuf ``Record`` messages.

wandb (0.2x+) writes its transaction log from its Go core and no longer ships the Python reader of it; the framing is
LevelDB's log format with a W&B file header (``:W&B``, magic 0xBEE1, version 0), 32 KiB blocks of records each with
a 7-byte header (crc32c, length, type: full, first, middle, last). The framing is undone here; every record is
parsed by ``wandb.proto.wandb_internal_pb2.Record``, the schema the W&B server reads when the run is synced.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
FILE_HEADER = struct.Struct("<4sHB")
RECORD_HEADER = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def payloads(path: Path) -> list[bytes]:
    """The records' bytes, in order."""
    data = path.read_bytes()
    ident, magic, version = FILE_HEADER.unpack_from(data, 0)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    out, pos, partial = [], FILE_HEADER.size, b""
    while pos + RECORD_HEADER.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD_HEADER.size:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = RECORD_HEADER.unpack_from(data, pos)
        if kind == 0 and length == 0:
            pos += left
            continue
        body = data[pos + RECORD_HEADER.size:pos + RECORD_HEADER.size + length]
        pos += RECORD_HEADER.size + length
        if kind == FULL:
            out.append(body)
        elif kind == FIRST:
            partial = body
        elif kind == MIDDLE:
            partial += body
        elif kind == LAST:
            out.append(partial + body)
            partial = b""
    return out


def records(path: Path) -> list[Any]:
    """Every record as a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for raw in payloads(path):
        r = pb.Record()
        r.ParseFromString(raw)
        out.append(r)
    return out


def read_run(run_dir: Path) -> dict[str, Any]:
    """What an offline run holds: its id, group and project, its config, and its history rows (``_step`` and the
    logged scalars), from every offline run folder under ``run_dir/wandb`` (a continued run has one per launch)."""
    out: dict[str, Any] = {"runs": [], "config": {}, "history": []}
    for f in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for r in records(f):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                out["runs"].append({"id": r.run.run_id, "group": r.run.run_group, "project": r.run.project})
                out["config"].update({i.key: json.loads(i.value_json) for i in r.run.config.update})
            elif kind == "config":
                out["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
            elif kind == "history":
                out["history"].append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                                       for i in r.history.item})
    return out
