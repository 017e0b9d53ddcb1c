#!/usr/bin/env bash
# One H200 (issue 42): train.deterministic=true. (1) GPT-2 small at world 1 (NCCL), two uninterrupted runs and one
# SIGKILLed after step 6 and resumed from step_4: bit for bit? (2) if time is left, its cost: tokens/s of 40 steps
# with and without it (compiled, CUDA graphs, compile cache shared under one root).
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv; python3 -c 'import torch; print("torch", torch.__version__)'; date -u
# (1)
timeout 330 python3 bench/resume_exact.py --out $OUT/exact.json --steps 12 --every 4 --kill 6 --world 1 -- \
  task=gpt2_small train.compile_cache=false train.val_every=0 train.deterministic=true > $OUT/exact.log 2>&1
echo "== exact rc=$? $(date -u +%T)"; grep -E '"(losses_equal|params_equal|max_abs_loss_diff|wall_s)"|bit for bit' $OUT/exact.log; tail -5 $OUT/exact.log
# (2)
for det in false true; do
  left=$(( 540 - ($(date +%s) - T0) )); [ $left -lt 60 ] && { echo "== cost det=$det skipped (${left}s left)"; continue; }
  (cd /tmp && timeout $left python3 -m ddp_runner task=gpt2_small world_size=1 train.max_steps=40 train.val_every=0 \
     checkpoint.final=false train.deterministic=$det output.root=/tmp/cost) > $OUT/cost_$det.log 2>&1
  echo "== cost det=$det rc=$? $(date -u +%T)"; tail -2 $OUT/cost_$det.log
done
for s in /tmp/cost/*/*/summary.json; do python3 -c "import json,sys; d=json.load(open('$s')); print('$s', d['median'], d['steps'], d['time_to_first_step_s'])"; cp $s $OUT/$(basename $(dirname $s)).summary.json; done
