"""Which compiled graph each kind of micro-step runs under DDP (tasks/ddp_compile.py), on the CPU with real gloo.

The compiler backend here only records the graphs it is given (and runs them as they are), so the test sees
what dynamo and its DDP graph splitter hand to inductor in a real run.
"""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_runner.tasks.engine.strategy.ddp_compile import compiled_forwards
from ddp_runner.tasks.gpt.model import GPT


def _gpt() -> GPT:
    torch.manual_seed(0)
    # ~0.8 MB of parameters per block: 1 MB buckets (DDP's smallest the splitter accepts) give several pieces.
    return GPT(vocab=64, context=16, width=128, layers=4, heads=2)


def _worker(rank: int, store: str, split: bool, with_buffer: bool, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
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
        torch.save({"graphs": graphs, "counts": counts, "same_grads": same_grads, "same_fn": sync is local,
                    "synced": torch.equal(both[0], both[1])}, f"{out}.{rank}")
        del sync, local, ddp
        gc.collect()  # DDP's reducer goes before the process group, not at interpreter exit
    finally:
        dist.destroy_process_group()


def _run(tmp_path, split: bool, with_buffer: bool = False) -> dict:
    out = str(tmp_path / "result")
    mp.spawn(_worker, args=(str(tmp_path / "store"), split, with_buffer, out), nprocs=2, join=True)
    results = [torch.load(f"{out}.{r}") for r in range(2)]
    assert results[0] == results[1]
    return results[0]


def test_split_cuts_only_the_synchronising_micro_steps_graph(tmp_path):
    r = _run(tmp_path, split=True)
    assert r["synced"]
    whole, *pieces = r["graphs"]  # the no_sync micro-step runs first, as in the engine
    assert len(pieces) >= 3, f"the synchronising graph is cut at DDP's buckets: {r['graphs']}"
    assert whole > max(pieces), "the other micro-steps run the model as one graph"
    assert r["counts"] == [1 + len(pieces)] * 3, "no recompilation"
    assert not r["same_fn"] and all(r["same_grads"]), "same gradients through either callable"


def test_no_split_compiles_one_whole_graph_for_every_micro_step(tmp_path):
    r = _run(tmp_path, split=False)
    assert len(r["graphs"]) == 1 and r["counts"] == [1, 1, 1] and r["same_fn"]
    assert r["synced"], "the model compiled in place under DDP still has its gradients all-reduced"


def test_a_model_with_buffers_keeps_ddps_forward_for_every_micro_step(tmp_path):
    # DDP broadcasts rank 0's buffers in every forward, no_sync or not, so there is no bypass.
    r = _run(tmp_path, split=True, with_buffer=True)
    assert r["same_fn"] and len(r["graphs"]) >= 3

