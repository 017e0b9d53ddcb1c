set -x
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
git log --oneline -1 2>/dev/null; nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv
R=.before/gpt_ddp_reference.py
P=train.profile.steps=2,train.profile.start=24,train.val_compile=eager
python3 bench/levers_bench.py --reference $R --only 1 --steps 42 --budget-s 300 --out $OUT/c1-small.json \
  --add "ddp 64x1 profiled=batch.per_rank=64,$P" --add "fsdp 16x4 profiled=strategy=fsdp,$P" \
  --add "fsdp 16x4 no reshard profiled=strategy=fsdp,strategy.reshard_after_forward=false,$P" 2>&1 | tee $OUT/c1-small.txt
mkdir -p $OUT/profiles; for d in /tmp/levers-*/*/*/; do [ -d $d/profile ] && mkdir -p $OUT/profiles/$(basename $d) && cp $d/profile/*.summary.json $d/config.yaml $OUT/profiles/$(basename $d)/; done
for p in "gpt2_medium,batch.per_rank=16,train.val_samples=256" "gpt2_large,batch.per_rank=16,train.val_samples=256"; do
  n=${p%%,*}; python3 bench/levers_bench.py --reference $R --only 2 --steps 32 --budget-s 60 --base "task=$p" --out $OUT/c1-$n.json 2>&1 | tee $OUT/c1-$n.txt; done
ls -la $OUT $OUT/profiles/*
