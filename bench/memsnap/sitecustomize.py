"""Bench only (bench/memory_peak.py puts this directory on PYTHONPATH): rank 0's worker records CUDA allocator
history from its start and writes the snapshot at exit, so that the peak can be taken apart afterwards."""

import os

_out = os.environ.get("DDP_BENCH_MEMSNAP")
if _out and os.environ.get("LOCAL_RANK") == "0" and not os.environ.get("DDP_BENCH_MEMSNAP_TAKEN"):
    os.environ["DDP_BENCH_MEMSNAP_TAKEN"] = "1"  # children (compile workers, data loaders) do not record
    import atexit
    import pickle

    import torch

    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=3_000_000)

    def _dump() -> None:
        os.makedirs(_out, exist_ok=True)
        with open(os.path.join(_out, "rank0.pickle"), "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)

    atexit.register(_dump)
