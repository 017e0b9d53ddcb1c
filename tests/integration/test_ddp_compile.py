"""Which compiled graph each kind of micro-step runs under DDP (tasks/ddp_compile.py), on the CPU with real gloo.

The compiler backend here only records the graphs it is given (and runs them as they are), so the test sees
what dynamo and its DDP graph splitter hand to inductor in a real run.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_runner.tasks.engine.strategy.ddp_compile import compiled_forwards
from ddp_runner.tasks.gpt.model import GPT
from tests.support.shared_runs import shared_run
from tests.support.spawn import spawn

# The three cases, (split, with_buffer), each traced in both ranks of ONE process group (a spawn of two processes
# per case cost more than the tracing): dynamo is reset and optimize_ddp set back to its default before each, and
# the whole-graph case, which turns optimize_ddp off, comes last.
CASES = {"split": (True, False), "buffer": (True, True), "no_split": (False, False)}


def _gpt() -> GPT:
    torch.manual_seed(0)
    # One block of ~3 MB of parameters (its MLP's two matrices 1 MB each): 1 MB buckets (DDP's smallest the
    # splitter accepts) give several pieces, with the fewest nodes to trace.
    return GPT(vocab=64, context=16, width=256, layers=1, heads=2)


def _case(rank: int, split: bool, with_buffer: bool) -> dict:
    model = _gpt()
    if with_buffer:
        model.register_buffer("scale", torch.ones(1))
    ddp = DDP(model, bucket_cap_mb=1)
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, _inputs: list) -> object:
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    sync, local = compiled_forwards(ddp, model, distributed=True, compile=True, split=split, backend=backend)
    params = list(model.parameters())
    x, y = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    counts, same_grads = [], []
    for _ in range(3):  # one optimizer step's micro-steps, three times: nothing recompiles
        with ddp.no_sync():
            local_grads = torch.autograd.grad(local(x, y), params)
            ddp_grads = torch.autograd.grad(sync(x, y), params)
        same_grads.append(all(torch.equal(a, b) for a, b in zip(local_grads, ddp_grads, strict=True)))
        sync(x, y).backward()
        counts.append(len(graphs))
    # Each rank's own batch, one synchronising backward: DDP leaves the same averaged gradients on both.
    for p in params:
        p.grad = None
    xr, yr = torch.randint(0, 64, (2, 16)) + rank, torch.randint(0, 64, (2, 16))
    sync(xr.clamp(max=63), yr).backward()
    flat = torch.cat([p.grad.flatten() for p in params])
    both = [torch.empty_like(flat) for _ in range(2)]
    dist.all_gather(both, flat)
    out = {"graphs": graphs, "counts": counts, "same_grads": same_grads, "same_fn": sync is local,
           "synced": torch.equal(both[0], both[1])}
    del sync, local, ddp
    gc.collect()  # DDP's reducer goes before the next case (and before the process group)
    return out


def _worker(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        results = {}
        for name, (split, with_buffer) in CASES.items():
            torch._dynamo.reset()
            torch._dynamo.config.optimize_ddp = True  # the default, as in a fresh process
            results[name] = _case(rank, split, with_buffer)
        torch.save(results, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def _spawn(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    out = str(root / "result")
    spawn(_worker, args=(str(root / "store"), out))
    return root


@pytest.fixture(scope="session")
def traced(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Each case's record (graphs handed to the backend, graph counts, gradient checks), the same on both ranks."""
    root = shared_run(tmp_path_factory, "ddp-compile-cases", _spawn)
    results = [torch.load(root / f"result.{r}") for r in range(2)]
    assert results[0] == results[1]
    return results[0]


def test_split_cuts_only_the_synchronising_micro_steps_graph(traced):
    r = traced["split"]
    assert r["synced"]
    whole, *pieces = r["graphs"]  # the no_sync micro-step runs first, as in the engine
    assert len(pieces) >= 3, f"the synchronising graph is cut at DDP's buckets: {r['graphs']}"
    assert whole > max(pieces), "the other micro-steps run the model as one graph"
    assert r["counts"] == [1 + len(pieces)] * 3, "no recompilation"
    assert not r["same_fn"] and all(r["same_grads"]), "same gradients through either callable"


def test_no_split_compiles_one_whole_graph_for_every_micro_step(traced):
    r = traced["no_split"]
    assert len(r["graphs"]) == 1 and r["counts"] == [1, 1, 1] and r["same_fn"]
    assert r["synced"], "the model compiled in place under DDP still has its gradients all-reduced"


def test_a_model_with_buffers_keeps_ddps_forward_for_every_micro_step(traced):
    # DDP broadcasts rank 0's buffers in every forward, no_sync or not, so there is no bypass.
    r = traced["buffer"]
    assert r["same_fn"] and len(r["graphs"]) >= 3
