"""A checkpoint's weights out of the run directory: ``model.safetensors`` (plain tensors, no pickle) and
``export.json`` (what they are: task, model config, step, loss), from any strategy.

A whole-state checkpoint (ddp, zero1) holds the model in ``state.pt``; a sharded one (fsdp) holds DCP shards,
consolidated here without a process group (``torch.distributed.checkpoint`` reads every shard's slices into whole
tensors), or its ``model.pt`` when the final save wrote one. Tied weights come out as separate tensors, so that
``model.load_state_dict(safetensors.torch.load_file(...))`` works as it is.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import fsspec
import torch
import yaml

from ddp_runner.contract import checkpoints as rules
from ddp_runner.contract import layout
from ddp_runner.tasks.engine.checkpoint import sharded, storage
from ddp_runner.tasks.engine.checkpoint.weights import INFO_FILE, WEIGHTS_FILE, clean_names, plain

FORMAT = "ddp-runner-export/1"
PROG = "ddp-export"
_EVERY_TASK = ("name", "module", "checks")  # the keys that say which task, not how its model is built
EXPORT_DIR = "export"


def default_dir(run_dir: str, step: int, fmt: str) -> str:
    """Where an export of step ``step`` goes by default: ``<run>/export/step_<N>`` (``-hf`` for the hf format)."""
    return layout.join(run_dir, EXPORT_DIR, f"step_{step}" + ("-hf" if fmt == "hf" else ""))


@dataclass(frozen=True)
class Candidates:
    """The checkpoints an export may take, newest first; ``explicit``: one was named (a checkpoint, or ``--step``),
    so its failure is the answer; ``skipped``: (name, why) of the folder's entries that are not checkpoints."""

    urls: list[str]
    explicit: bool = False
    skipped: list[tuple[str, str]] = field(default_factory=list)


def candidates(source: str, step: int | None = None) -> Candidates:
    """The checkpoints ``source`` names: a checkpoint itself, else a run directory's complete ones (newest first),
    or its step ``step``. ValueError with the fix when there is none."""
    if storage.is_checkpoint(source) and step is None:
        return Candidates([source], explicit=True)
    if step is None:
        _refuse_uncommitted(source)
    root = layout.join(source.rstrip("/"), layout.CHECKPOINTS)
    found = dict(storage.list_complete(root))
    skipped = storage.list_skipped(root)
    if not found:
        raise ValueError(f"{source}: no complete checkpoint under {root}. Fix: point at a run directory that saved"
                         " one (checkpoint.final=true), or at a checkpoint step_<N>")
    if step is None:
        return Candidates([found[s] for s in sorted(found, reverse=True)], skipped=skipped)
    if step not in found:
        raise ValueError(f"{source}: no complete checkpoint of step {step}; there are steps"
                         f" {', '.join(map(str, sorted(found)))}")
    return Candidates([found[step]], explicit=True, skipped=skipped)


def _refuse_uncommitted(source: str) -> None:
    """A ``<run>/checkpoints/step_<N>`` that is no checkpoint is a save that never committed, not a run directory:
    say so, and name the newest committed one (looking under ``step_<N>/checkpoints`` would only confuse)."""
    parent, _, name = source.rstrip("/").rpartition("/")
    if rules.step_of(name) is None or parent.rpartition("/")[2] != layout.CHECKPOINTS:
        return
    newest = storage.latest(parent)
    instead = (f"the newest committed one is {newest.rstrip('/').rpartition('/')[2]}: {PROG} {newest}" if newest
               else "there is no committed checkpoint in this run")
    raise ValueError(f"{source}: {name} is not committed (incomplete: its save never wrote {rules.MARKER_FILE});"
                     f" {instead}")


def load_newest(found: Candidates) -> tuple[dict[str, torch.Tensor], dict[str, Any], str, list[tuple[str, str]]]:
    """The weights and small state of the newest candidate that passes its integrity check, its URL, and the
    (url, reason) of each newer one passed over, as a resume falls back (``storage.load_first_good``); a candidate
    named explicitly is loaded alone, so that its failure is the answer (CheckpointError)."""
    if found.explicit:
        url, skipped = found.urls[0], []
        state = storage.load(url, map_location="cpu")
    else:
        state, url, skipped = storage.load_first_good(found.urls, map_location="cpu")
    return weights_of(url, state), state, url, skipped


def weights_of(url: str, state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The whole model's weights of the checkpoint at ``url`` whose ``state.pt`` loaded as ``state``."""
    if not sharded.is_sharded(state):
        return clean_names(state["model"])
    ckpt = url.rstrip("/")
    if ckpt.endswith("/" + storage.STATE_FILE):
        ckpt = ckpt.rsplit("/", 1)[0]
    consolidated = f"{ckpt}/{sharded.EXPORT_FILE}"
    fs, path = fsspec.core.url_to_fs(consolidated)
    if fs.exists(path):
        with fs.open(path, "rb") as f:
            return clean_names(torch.load(f, map_location="cpu", weights_only=True))
    return clean_names(_consolidate(f"{ckpt}/{state['sharded']}"))


def _consolidate(shards: str) -> dict[str, torch.Tensor]:
    """The model's whole tensors from DCP shards, read without a process group."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if storage.is_local(shards):
        reader: Any = dcp.FileSystemReader(shards)
    else:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader  # not re-exported (torch 2.13)

        reader = FsspecReader(shards)
    meta = reader.read_metadata().state_dict_metadata
    model = {k[len("model."):]: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items()
             if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
    dcp.load({"model": model}, storage_reader=reader, no_dist=True)
    return model


def describe(state: dict[str, Any]) -> dict[str, Any]:
    """What the weights are: the task, its model config, the step, the last logged training loss."""
    cfg = yaml.safe_load(state.get("config") or "{}") or {}
    task = cfg.get("task") or {}
    progress = state.get("progress") or {}
    losses = [x for x in progress.get("losses") or [] if x is not None]
    return {"format": FORMAT, "task": task.get("name"), "module": task.get("module"), "model": model_settings(task),
            "step": progress.get("step"), "loss": losses[-1] if losses else None, "plan": state.get("plan")}


def model_settings(task: dict[str, Any]) -> dict[str, Any] | None:
    """What builds the model: a built-in task's ``task.model``; a task of the user's own keeps its settings as
    ``task.<key>`` (``+task.hidden=64``), so those, without the keys every task has."""
    if "model" in task:
        return task["model"]
    own = {k: v for k, v in task.items() if k not in _EVERY_TASK}
    return own or None


def write_safetensors(weights: dict[str, torch.Tensor], info: dict[str, Any], out_dir: str) -> list[str]:
    """``model.safetensors`` and ``export.json`` into ``out_dir`` (any fsspec URL); returns the files written."""
    from safetensors.torch import save

    fs, path = fsspec.core.url_to_fs(out_dir)
    fs.makedirs(path, exist_ok=True)
    with fs.open(f"{path}/{WEIGHTS_FILE}", "wb") as f:
        f.write(save(plain(weights), metadata={"format": "pt"}))
    with fs.open(f"{path}/{INFO_FILE}", "w") as f:
        f.write(json.dumps(info, indent=2) + "\n")
    return [os.path.join(out_dir, WEIGHTS_FILE), os.path.join(out_dir, INFO_FILE)]


def write(weights: dict[str, torch.Tensor], state: dict[str, Any], out_dir: str, fmt: str,
          data_path: str | None = None) -> list[str]:
    """Export ``weights`` as ``fmt`` (``safetensors`` or ``hf``) into ``out_dir``."""
    info = describe(state)
    if fmt != "hf":
        return write_safetensors(weights, info, out_dir)
    from ddp_runner.tasks.gpt import hf

    if storage.is_local(out_dir):
        return hf.write(weights, info, out_dir, tokenizer_dir=hf.tokenizer_dir(data_path))
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # transformers writes local files: then uploaded
        hf.write(weights, info, tmp, tokenizer_dir=hf.tokenizer_dir(data_path))
        fs, path = fsspec.core.url_to_fs(out_dir)
        fs.put(tmp + "/", path, recursive=True)
        return [layout.join(out_dir, n) for n in sorted(os.listdir(tmp))]
