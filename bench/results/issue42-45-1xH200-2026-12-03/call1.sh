#!/usr/bin/env bash
# One H200 (issues 42 and 45): (1) GPT-2 small killed and resumed at world 1 (NCCL), bit for bit against the
# uninterrupted run and a second one; (2) a stop (SIGINT to the driver) during the final validation of GPT-2 small:
# the final checkpoint committed, the run interrupted, resume=<run dir> validates it and completes; (3) throughput
# beside the hand-written reference (the training loop's stop path changed this session).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv; python3 -c 'import torch; print("torch", torch.__version__)'; date -u
# (1)
timeout 330 python3 bench/resume_exact.py --out $OUT/exact.json --steps 12 --every 4 --kill 6 --world 1 -- \
  task=gpt2_small train.compile_cache=false train.val_every=0 > $OUT/exact.log 2>&1
echo "== exact rc=$? $(date -u +%T)"; grep -E '"(losses_equal|params_equal|max_abs_loss_diff|resumed_from)"|bit for bit' $OUT/exact.log
# (2)
(cd /tmp && timeout 300 python3 $OLDPWD/bench/stop_final_validation.py --steps 30) > $OUT/stopval.json 2> $OUT/stopval.log
echo "== stop during final validation rc=$? $(date -u +%T)"; cat $OUT/stopval.json | head -60
