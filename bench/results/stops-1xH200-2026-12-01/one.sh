#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
timeout 200 python3 bench/stop_latency.py --preset gpt2_small --steps 100 --stop-at 50 --stops 1 --runs 1 --out /tmp/one \
    -- train.compile_cache=false > "$OUT/one.log" 2>&1
echo "== rc=$?"; tail -c 7000 "$OUT/one.log"
