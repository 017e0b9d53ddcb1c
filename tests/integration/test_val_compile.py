"""Validation of a compiled model pays no second compile tax (issue 33, tasks/engine/val_compile.py).

A tiny GPT is compiled in place as the engine does (``model.compile``), with a backend that only counts the graphs
dynamo hands it, and trained one step; then the engine's ``evaluate`` runs over a validation set whose last batch
is smaller than the others, in a real one-process gloo group.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

from ddp_runner.tasks.engine import val_compile
from ddp_runner.tasks.engine.rank import Context
from ddp_runner.tasks.engine.validation import evaluate
from ddp_runner.tasks.gpt.data import TokenWindows
from ddp_runner.tasks.gpt.model import GPT

SAMPLES, BATCH, CONTEXT = 7, 2, 8  # batches of 2, 2, 2 and a last one of 1


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("valcompile")
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    try:
        yield tmp
    finally:
        dist.destroy_process_group()


def _setup(tmp) -> tuple[GPT, list[int], TokenWindows, Context]:
    torch.manual_seed(0)
    model = GPT(vocab=32, context=CONTEXT, width=16, layers=2, heads=2)
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, _inputs: list) -> object:
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    model.compile(backend=backend)
    tokens = tmp / "tokens.bin"
    if not tokens.exists():
        np.random.default_rng(0).integers(0, 32, size=SAMPLES * CONTEXT + 1, dtype=np.uint16).tofile(tokens)
    data = TokenWindows(str(tokens), "uint16", context=CONTEXT, start=0, n_tokens=SAMPLES * CONTEXT + 1)
    x, y = torch.randint(0, 32, (BATCH, CONTEXT)), torch.randint(0, 32, (BATCH, CONTEXT))
    model(x, y).backward()  # training compiled its graph
    assert len(graphs) == 1
    return model, graphs, data, Context(0, 0, 1, torch.device("cpu"), str(tmp), str(tmp), None)


def test_eager_validation_compiles_nothing_and_compiled_validation_one_graph_once(group):
    model, graphs, data, ctx = _setup(group)
    eager = evaluate(model, data, ctx, BATCH, "fp32", compile_mode="eager")
    assert len(graphs) == 1, "eager validation compiled nothing"
    count: dict[str, int] = {}
    with val_compile.counting(count):
        compiled = evaluate(model, data, ctx, BATCH, "fp32", compile_mode="compiled")
    assert len(graphs) == 2 and count["graphs_compiled"] == 1, \
        "one inference graph; the last, smaller batch ran eagerly instead of compiling a dynamic graph"
    assert compiled == pytest.approx(eager, rel=1e-5)
    again = evaluate(model, data, ctx, BATCH, "fp32", compile_mode="compiled")
    assert len(graphs) == 2 and again == compiled, "a later validation reuses the inference graph"
    x, y = torch.randint(0, 32, (BATCH, CONTEXT)), torch.randint(0, 32, (BATCH, CONTEXT))
    model(x, y).backward()
    assert len(graphs) == 2, "training after validation reuses its own graph"


def test_without_a_stance_the_partial_batch_compiles_a_second_eval_graph(group):
    """What validation cost before: the same loop with no stance compiles an inference graph and then a dynamic
    one for the last batch (GPT-2 small: 25.7 s of validation against 8.4 s of training on an H200)."""
    model, graphs, data, ctx = _setup(group)
    model.eval()
    with torch.no_grad():
        for b in (2, 2, 2, 1):
            model(*(t[:b] for t in (torch.randint(0, 32, (2, CONTEXT)), torch.randint(0, 32, (2, CONTEXT)))))
    assert len(graphs) == 3


def test_auto_compiles_for_periodic_validation_only():
    assert val_compile.resolve("auto", 0, 100) == "eager"
    assert val_compile.resolve(None, 100, 100) == "eager"  # validates once, at the end
    assert val_compile.resolve("auto", 10, 100) == "compiled"
    assert val_compile.resolve("eager", 10, 100) == "eager"
    with pytest.raises(ValueError, match="train.val_compile"):
        val_compile.resolve("never", 0, 1)


class _Mlp(torch.nn.Module):
    """A model that is not compiled: forward(x, y) returns its mean loss, as a task's does."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.net(x), y)


def test_a_validation_without_cuda_graphs_never_imports_inductor(group, monkeypatch):
    """Issue 43, item 10: each validation batch in ``compiled`` mode marked a CUDA-graph step, which imports
    torch._inductor (4 s of a loaded 2-core host): a tiny MLP's first validation cost 30 times a training pass
    over the same samples. The mark is made only where CUDA graph trees exist (their module is imported)."""
    calls: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: calls.append(1))
    monkeypatch.delitem(sys.modules, "torch._inductor.cudagraph_trees", raising=False)
    data = torch.utils.data.TensorDataset(torch.randn(7, 2), torch.randint(0, 3, (7,)))
    ctx = Context(0, 0, 1, torch.device("cpu"), str(group), str(group), None)
    loss = evaluate(_Mlp(), data, ctx, BATCH, "fp32", compile_mode="compiled")
    assert calls == [] and loss > 0, "no graph tree exists: nothing to mark, and torch._inductor stays unimported"
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", object())  # a compiled model's trees
    evaluate(_Mlp(), data, ctx, BATCH, "fp32", compile_mode="compiled")
    assert len(calls) == 4, "where graph trees exist, each of the 4 batches is a new step of the tree"
