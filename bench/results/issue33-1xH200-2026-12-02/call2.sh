set -x
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv
R=.before/gpt_ddp_reference.py
python3 bench/levers_bench.py --reference $R --only 1,2,11 --steps 42 --budget-s 250 --out $OUT/c2-small.json \
  --add "ddp 16x4 again (warm machine)=train.val_compile=auto" \
  --add "ddp 64x1 profiled=batch.per_rank=64,train.profile.steps=2,train.profile.start=24,train.val_compile=eager" 2>&1 | grep -v '^\[{' | tee $OUT/c2-small.txt
cd /tmp && tar czf $OUT/c2-profiles.tgz levers-*/*/*/profile/*.summary.json levers-*/*/*/summary.json; cd -
for p in "gpt2_xl,batch.per_rank=8" "gpt_6b,strategy=fsdp,batch.per_rank=8,batch.global=8"; do
  n=${p%%,*}; python3 bench/levers_bench.py --reference $R --only 2 --steps 32 --budget-s 60 --base "task=$p" --out $OUT/c2-$n.json 2>&1 | grep -v '^\[{' | tee $OUT/c2-$n.txt; done
cd /tmp && python3 -m ddp_runner task=gpt2_small strategy=fsdp world_size=1 dry_run=true > $OUT/c2-fsdp-dry.txt 2>&1; grep -n "warning\|memory per rank" $OUT/c2-fsdp-dry.txt
ls -la $OUT
