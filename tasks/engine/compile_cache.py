"""One compile cache per output root: jobs of a sweep, and reruns under the same root, do not recompile what an
earlier one compiled.

Inductor's FX-graph cache and AOTAutograd's cache (compiled forward and backward graphs) and Triton's kernel cache
are pointed at ``<output.root>/.compile_cache`` before anything compiles. A remote root (s3://…) cannot hold them
(the caches are plain local files), so such runs share ``~/.cache/ddp-runner/compile`` on their host instead. A
``TORCHINDUCTOR_CACHE_DIR`` the user set in the environment wins (inductor's own default does not). The caches
are safe to share between ranks and concurrent jobs: entries are keyed by content and written by rename.
"""

from __future__ import annotations

import os
from typing import Any

from ddp_runner.contract.layout import compile_cache_dir as cache_dir

ENV_INDUCTOR = "TORCHINDUCTOR_CACHE_DIR"
ENV_TRITON = "TRITON_CACHE_DIR"


def configure(root: str) -> str:
    """Point the compile caches at ``root``'s shared cache (or the user's own) and turn them on; returns the
    inductor cache directory used. Call before the first compile: the directories are read when compiling."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # Inductor writes its default into the environment the first time it looks (and children inherit it): that
    # value is not a choice of the user's.
    own = os.environ.get(ENV_INDUCTOR)
    path = own if own and os.path.abspath(own) != os.path.abspath(default_cache_dir()) else cache_dir(root)
    os.makedirs(path, exist_ok=True)
    os.environ[ENV_INDUCTOR] = path
    os.environ.setdefault(ENV_TRITON, os.path.join(path, "triton"))
    # On by default in recent torch; set so that an older default or an environment switch cannot leave them off.
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return path


def hits() -> dict[str, Any]:
    """This process's compile-cache lookups so far: FX-graph and AOTAutograd hits and misses, and their totals."""
    from torch._dynamo.utils import counters

    out = {"fxgraph_hit": counters["inductor"]["fxgraph_cache_hit"],
           "fxgraph_miss": counters["inductor"]["fxgraph_cache_miss"],
           "autograd_hit": counters["aot_autograd"]["autograd_cache_hit"],
           "autograd_miss": counters["aot_autograd"]["autograd_cache_miss"]}
    out["cache_hits"] = out["fxgraph_hit"] + out["autograd_hit"]
    out["cache_misses"] = out["fxgraph_miss"] + out["autograd_miss"]
    return out


def seconds(top: int = 12) -> dict[str, float]:
    """Where this process's compile time went so far: seconds per phase torch times (``dynamo_timed``), the
    largest first, e.g. tracing, AOTAutograd, inductor's code generation, loading from the cache, waiting on
    Triton's compile workers. Phases nest, so the figures overlap and do not add up."""
    from torch._dynamo.utils import compilation_time_metrics

    totals = {name: sum(values) for name, values in compilation_time_metrics.items() if values}
    return {name: round(s, 3) for name, s in sorted(totals.items(), key=lambda kv: -kv[1])[:top]}
