#!/usr/bin/env bash
# Issue 28 on one H200: signal -> committed checkpoint for GPT-2 small (bf16, compiled), and the stop vote's cost:
# log_every=10 (9 of 10 votes standalone all-reduces) and log_every=1 (every vote in the log step's gather).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
nvidia-smi -L; python3 -c 'import torch, ddp_runner; print("torch", torch.__version__, ddp_runner.__file__)'; date -u
timeout 330 python3 bench/stop_latency.py --preset gpt2_small --steps 200 --stop-at 50 --stops 2 --runs 2 --out /tmp/sl10 \
    -- train.compile_cache=false > "$OUT/stop_log_every_10.log" 2>&1
echo "== log_every=10 rc=$? $(date -u +%T)"; tail -c 1500 "$OUT/stop_log_every_10.log"
timeout 200 python3 bench/stop_latency.py --preset gpt2_small --steps 200 --stop-at 50 --stops 1 --runs 1 --out /tmp/sl1 \
    -- train.compile_cache=false train.log_every=1 > "$OUT/stop_log_every_1.log" 2>&1
echo "== log_every=1 rc=$? $(date -u +%T)"; tail -c 1500 "$OUT/stop_log_every_1.log"
