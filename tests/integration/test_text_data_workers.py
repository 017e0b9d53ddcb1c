"""Token-window datasets over fsspec files: formats, URLs, split sizes, window contents, pickling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from ddp_runner.tasks.gpt.data import make_datasets


def data_cfg(path: str | None, fmt: str = "auto", val_fraction: float = 0.1, val_path: str | None = None):
    return OmegaConf.create(dict(name="text", path=path, val_path=val_path, format=fmt, val_fraction=val_fraction))


def test_dataloader_with_worker_processes(tmp_path: Path) -> None:
    raw = np.random.default_rng(2).integers(0, 256, 4000, dtype=np.uint8)
    path = tmp_path / "corpus.txt"
    path.write_bytes(raw.tobytes())
    train, _ = make_datasets(data_cfg(str(path)), 32)
    train[0]  # the parent opens its memmap first: each worker must still open its own
    loader = torch.utils.data.DataLoader(train, batch_size=8, num_workers=2, shuffle=False)
    xs = torch.cat([x for x, _ in loader])
    assert xs.shape == (len(train), 32)
    assert torch.equal(xs[5], train[5][0])
