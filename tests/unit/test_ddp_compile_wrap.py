"""Which compiled graph each kind of micro-step runs under DDP (tasks/ddp_compile.py), on the CPU with real gloo.

The compiler backend here only records the graphs it is given (and runs them as they are), so the test sees
what dynamo and its DDP graph splitter hand to inductor in a real run.
"""

from __future__ import annotations

import torch

from ddp_runner.tasks.engine.strategy.ddp_compile import compiled_forwards, ddp_forward_needed
from ddp_runner.tasks.gpt.model import GPT


def _gpt() -> GPT:
    torch.manual_seed(0)
    # ~0.8 MB of parameters per block: 1 MB buckets (DDP's smallest the splitter accepts) give several pieces.
    return GPT(vocab=64, context=16, width=128, layers=4, heads=2)


def test_ddp_forward_needed_only_for_buffers():
    assert not ddp_forward_needed(_gpt())
    assert ddp_forward_needed(torch.nn.BatchNorm1d(4))


def test_without_compile_both_are_the_wrapper():
    model = _gpt()
    assert compiled_forwards(model, model, distributed=True, compile=False, split=True) == (model, model)

