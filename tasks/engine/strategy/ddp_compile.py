"""How the model is compiled when DDP wraps it: which graph each kind of micro-step runs.

Under ``torch.compile`` DDP's all-reduce can only start during the backward if the compiler cuts the model's graph
at DDP's gradient buckets (dynamo's ``optimize_ddp``): each piece's backward then hands its gradients to DDP as it
finishes. The cut has a cost on every micro-step that runs the pieces (no fusion across a cut, more graphs to
replay). Two ways are offered (``train.ddp_split_graph``):

- split (the default; PyTorch alone would cut every micro-step's graph): only the synchronising micro-step runs
  the cut graph. The others, under ``no_sync``, run the module through a frame of their own, compiled as one
  whole graph. That is the same computation: under ``no_sync`` DDP's forward only calls the module (for a model
  without buffers to broadcast), and the engine runs those backwards with ``autograd.grad``, which DDP's reducer
  never sees.
- not split: one whole graph for every micro-step, the model compiled in place under DDP's forward; the
  all-reduce follows the backward.

The separate frame matters: dynamo caches compiled code on the code object it compiled, so calling the module
itself would reuse whichever graph, cut or whole, was compiled first.

``train.compile_scope=blocks`` compiles the repeated blocks instead of the whole model (regional compilation):
each child of the model's ``nn.ModuleList``s is compiled in place, and since identical blocks run the same code
with their parameters as inputs, dynamo traces and inductor compiles one block once and every other block reuses
that code. The first compile is a fraction of the whole model's; what runs between the blocks (embeddings, the
final norm, the loss) stays eager, and nothing fuses across a block boundary. Under DDP no graph needs cutting:
each block's backward hands its gradients to DDP as it finishes, so the all-reduce overlaps the backward anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def ddp_forward_needed(model: torch.nn.Module) -> bool:
    """Whether a micro-step under ``no_sync`` must still go through DDP's forward: only to broadcast rank 0's
    buffers (``broadcast_buffers``, on by default), so only for a model that has buffers."""
    return any(True for _ in model.buffers())


SCOPES = ("model", "blocks")


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The children of the outermost ``nn.ModuleList``s in ``model``: the repeated blocks of a transformer (a
    ModuleList inside a block is part of that block's graph, not compiled again)."""
    chosen: list[str] = []
    blocks: list[torch.nn.Module] = []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and not any(name.startswith(c + ".") for c in chosen):
            chosen += [f"{name}.{i}" if name else str(i) for i in range(len(m))]
            blocks += list(m)
    return blocks


def compile_blocks(model: torch.nn.Module, **compile_kwargs: Any) -> int:
    """Compile each repeated block of ``model`` in place (its state-dict keys stay as they are); returns how many."""
    blocks = repeated_blocks(model)
    for b in blocks:
        b.compile(**compile_kwargs)
    return len(blocks)


def compiled_forwards(ddp: torch.nn.Module, model: torch.nn.Module, *, distributed: bool, compile: bool,
                      split: bool, scope: str = "model",
                      **compile_kwargs: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The callables for the synchronising micro-step and for the others: ``(sync, local)``.

    ``ddp`` is the DDP wrapper of ``model`` (or its single-process stand-in when not ``distributed``);
    ``scope``: ``model`` (one graph) or ``blocks`` (the repeated blocks, see above; a model without any falls back
    to ``model``); ``compile_kwargs`` go to ``torch.compile``. Without compile, or with one process, both are the
    same callable.
    """
    if scope not in SCOPES:
        raise ValueError(f"train.compile_scope={scope!r}: not one of {', '.join(SCOPES)}."
                         " Fix: train.compile_scope=model or train.compile_scope=blocks")
    if not compile:
        return ddp, ddp
    if scope == "blocks":
        if compile_blocks(model, **compile_kwargs):
            torch._dynamo.config.optimize_ddp = False  # a block's graph is not cut: its gradients come out together
            return ddp, ddp
        print("compile: train.compile_scope=blocks, but the model has no nn.ModuleList of blocks;"
              " compiling the whole model", flush=True)
    if not (distributed and split):
        # One whole graph; DDP's hooks fire after the backward. The model is compiled in place, under DDP's
        # forward rather than through it, so that one process (no DDP) and several trace the very same graph:
        # compiled through the wrapper, its graph's inputs are named after it, and the 2-rank job of a sweep
        # missed the 1-rank job's AOTAutograd cache entry (measured on 2×H200, BENCHMARKS.md).
        torch._dynamo.config.optimize_ddp = False
        model.compile(**compile_kwargs)
        return ddp, ddp
    sync = torch.compile(ddp, **compile_kwargs)
    if ddp_forward_needed(model):
        return sync, sync

    def whole_graph(*args: Any, **kwargs: Any) -> Any:  # its own code object, so its own compiled graph
        return model(*args, **kwargs)

    return sync, torch.compile(whole_graph, **compile_kwargs)
