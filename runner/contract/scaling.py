"""summary.json's ``scaling_facts``: what a rank knows about its communication and its share of the host, which the
scaling projection (runner/report/projection.py) needs and the time breakdown does not say. The worker writes it
(tasks/engine/scaling_facts.py), ddp-compare reads it. Standard library only.
"""

from __future__ import annotations

SUMMARY_KEY = "scaling_facts"
# Bytes one reduction of all the gradients moves (trainable elements × the element size on the wire: 2 under
# train.ddp_comm=bf16, fsdp's reduce dtype, else the gradients' own).
GRAD_BYTES = "grad_bytes"
# Bytes of all the trainable parameters in the dtype a sharded strategy gathers them in (fsdp's param dtype).
PARAM_BYTES = "param_bytes"
TRAINABLE = "trainable_params"
# This rank's intra-op threads, the CPU cores it may run on, and the ranks on its host (LOCAL_WORLD_SIZE): CPU
# ranks of one host share its cores.
THREADS = "threads_per_rank"
CORES = "cores"
LOCAL_WORLD = "ranks_per_node"
