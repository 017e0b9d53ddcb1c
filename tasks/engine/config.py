"""The resolved config as workers see it: plain YAML read from the run directory, dotted access.

Workers need no Hydra or OmegaConf: the driver already resolved everything, and skipping those imports
keeps every rank's start-up short.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import fsspec
import yaml

from ddp_runner.contract import layout, secrets


class Config(dict):
    """A dict whose keys also read as attributes (``cfg.train.lr``), recursively."""

    def __getattr__(self, name: str) -> Any:
        try:
            return _wrap(self[name])
        except KeyError as exc:
            raise AttributeError(f"config has no key {name!r}") from exc

    def __getitem__(self, key: str) -> Any:
        return _wrap(dict.__getitem__(self, key))

    def get(self, key: str, default: Any = None) -> Any:
        return _wrap(dict.get(self, key, default))

    def to_yaml(self) -> str:
        """The config as YAML text."""
        return yaml.safe_dump(_plain(self), sort_keys=False)


def _wrap(value: Any) -> Any:
    return Config(value) if isinstance(value, dict) and not isinstance(value, Config) else value


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in dict.items(value)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class BatchPlan:
    """The plan's batch on this launch's world: the one place the global batch is computed on the worker side."""

    world_size: int
    per_rank: int
    accumulation: int

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step: per-rank batch × world size × accumulation."""
        return self.per_rank * self.world_size * self.accumulation

    def as_dict(self) -> dict[str, int]:
        """The plan as run.json, TensorBoard and checkpoints record it."""
        return {"world_size": self.world_size, "per_rank_batch": self.per_rank, "accumulation": self.accumulation,
                "global_batch": self.global_batch}


AUTO = "auto"  # batch.per_rank=auto: the micro-batch is fitted to the device (tasks/engine/micro_fit.py)


def auto_micro_batch(cfg: Config) -> bool:
    """Whether this run fits its own micro-batch (``batch.per_rank=auto``, under a fixed ``batch.global``)."""
    return cfg.batch.per_rank == AUTO


def largest_divisor(share: int, at_most: int) -> int:
    """The largest micro-batch that divides the per-rank ``share`` and is no larger than ``at_most`` (at least 1)."""
    return max(b for b in range(1, max(1, min(share, at_most)) + 1) if share % b == 0)


def batch_plan(cfg: Config, world_size: int, start: int | None = None) -> BatchPlan:
    """``batch.per_rank`` and ``batch.accumulation`` of ``cfg`` on ``world_size`` ranks (the world this launch
    runs in, which an elastic restart may have changed). ``batch.per_rank=auto``: the rank's share of
    ``batch.global`` in micro-batches of ``start`` (the driver's choice, run.json's plan), or of the largest
    divisor of the share below it (another world size shares the global batch differently); the whole share when
    ``start`` is None."""
    if not auto_micro_batch(cfg):
        return BatchPlan(world_size, cfg.batch.per_rank, cfg.batch.accumulation)
    share = cfg.batch["global"] // world_size
    per_rank = largest_divisor(share, start or share)
    return BatchPlan(world_size, per_rank, share // per_rank)


def as_recorded(cfg: Config) -> dict[str, Any]:
    """The config as plain data with its secrets masked (URL credentials, values from the environment): what a
    tracker, a log line or a checkpoint may record. ``cfg`` itself holds the real values, for the task's use."""
    return secrets.redact_tree(_plain(cfg), secrets.handed_over())


def read_manifest(run_dir: str) -> dict[str, Any]:
    """The driver's run.json, or {} when it cannot be read. One whole read: a file object on an object store reads
    by ranges pinned to the version it first saw, and fails when another node replaces run.json meanwhile."""
    try:
        fs, path = fsspec.core.url_to_fs(layout.join(run_dir, layout.MANIFEST))
        return json.loads(fs.cat_file(path))
    except (OSError, ValueError):
        return {}


def load_config(run_dir: str) -> Config:
    """The resolved config the driver wrote into the run directory: what this run runs, exactly."""
    with fsspec.open(layout.join(run_dir, layout.CONFIG), "r") as f:
        cfg = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    # The values config.yaml holds masked (URL credentials, values from the environment): the driver hands the
    # real ones over through the environment, never through a file.
    for key, value in secrets.decode(os.environ.get(secrets.ENV_SECRETS)).items():
        secrets.set_key(cfg, key, value)
    return Config(cfg)
