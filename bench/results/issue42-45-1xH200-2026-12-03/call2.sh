#!/usr/bin/env bash
# One H200 (issues 42 and 45): (call 2 of 2; call1.sh has (1) and (2)) (1) GPT-2 small killed and resumed at world 1 (NCCL), bit for bit against the
# uninterrupted run and a second one; (2) a stop (SIGINT to the driver) during the final validation of GPT-2 small:
# the final checkpoint committed, the run interrupted, resume=<run dir> validates it and completes; (3) throughput
# beside the hand-written reference (the training loop's stop path changed this session).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv; python3 -c 'import torch; print("torch", torch.__version__)'; date -u
# (3)
timeout 300 python3 bench/levers_bench.py --reference .ref/gpt_ddp_reference.py --only 1,2 --steps 42 --budget-s 200 --out $OUT/pair.json > $OUT/pair.txt 2>&1
echo "== pair rc=$? $(date -u +%T)"; grep -v '^\[{' $OUT/pair.txt | tail -12
