"""How validation runs a compiled model without paying for a second compile (``train.val_compile``).

Training compiles the model for gradients in train mode; validation calls the same module under ``no_grad`` in
eval mode. Dynamo guards on both, so the first validation used to compile a second, inference graph from nothing,
and the last, partial batch of the validation set (another batch size) a third, dynamic one: 25.7 s of validation
against 8.4 s of training for GPT-2 small on one H200, 84 s for gpt2_xl (BENCHMARKS.md). The modes:

- ``eager``: every compiled frame runs uncompiled during validation (``torch.compiler.set_stance("force_eager")``):
  no compile at all; each forward runs at eager speed. Best when a run validates a few times.
- ``compiled``: the first batch may compile the inference graph once (a later validation, and a rerun under the
  same output root through the compile cache, reuse it); every other batch runs under ``eager_on_recompile``: it
  uses that graph when its guards hold and runs eagerly otherwise, so the last, smaller batch never compiles.
  Best for frequent validation. A model compiled only through the DDP wrapper (``ddp_split_graph=true`` on several
  ranks) is not compiled in place, so it validates eagerly either way.
- ``auto``: ``compiled`` when the run validates periodically (``train.val_every`` > 0 and below the run's steps),
  else ``eager``: a graph compiled for one validation at the end never pays for itself.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch

from ddp_runner.contract.errors import VAL_COMPILE as MODES


def resolve(mode: str | None, val_every: int | None, total_steps: int) -> str:
    """The mode a run validates in: ``eager`` or ``compiled`` (``auto`` by how often it validates)."""
    mode = mode or "auto"
    if mode not in MODES:
        raise ValueError(f"train.val_compile={mode!r}: not one of {', '.join(MODES)}. Fix: train.val_compile=auto")
    if mode != "auto":
        return mode
    return "compiled" if val_every and val_every < total_steps else "eager"


def stance(mode: str, first_batch: bool) -> contextlib.AbstractContextManager:
    """The compiler's stance for one validation batch (``mode``: ``eager`` or ``compiled``)."""
    if mode == "eager":
        return torch.compiler.set_stance("force_eager")
    if mode == "compiled" and not first_batch:
        return torch.compiler.set_stance("eager_on_recompile")
    return contextlib.nullcontext()


def mark_step() -> None:
    """Tell CUDA graph trees (``reduce-overhead``) that a new validation batch begins, where any exist: the call
    imports torch._inductor, seconds of CPU that made the first validation of an uncompiled model cost several
    times its training (BENCHMARKS.md, 2026-12-03). No graph tree exists before that module is imported."""
    if "torch._inductor.cudagraph_trees" in sys.modules:
        torch.compiler.cudagraph_mark_step_begin()


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far (every compile and recompile counts one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@contextlib.contextmanager
def counting(into: dict[str, int]) -> Iterator[None]:
    """Count the graphs compiled inside this block into ``into["graphs_compiled"]``."""
    before = graphs_compiled()
    try:
        yield
    finally:
        into["graphs_compiled"] = into.get("graphs_compiled", 0) + graphs_compiled() - before
