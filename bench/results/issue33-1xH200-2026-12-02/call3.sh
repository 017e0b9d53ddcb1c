set -x
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=.before/gpt_ddp_reference.py
python3 bench/levers_bench.py --reference $R --only 1,2,11 --steps 42 --budget-s 200 --out $OUT/c3-small.json 2>&1 | grep -v '^\[{' | tee $OUT/c3-small.txt
mkdir -p /tmp/sm && cd /tmp/sm && /usr/bin/time -f "smoke wall %e s" python3 -m ddp_runner task=smoke 2>&1 | tail -4 | tee $OUT/c3-smoke.txt
python3 -c "import json,glob; s=json.load(open(sorted(glob.glob('/tmp/sm/outputs/*/*/summary.json'))[-1])); print({k: s.get(k) for k in ('status','steps','time_to_first_step_s','startup_breakdown_s')})" | tee -a $OUT/c3-smoke.txt
ps -eo pid,args | grep -c "[d]dp-rank\|[f]orkserver" | tee -a $OUT/c3-smoke.txt
python3 -m ddp_runner task=gpt2_small strategy=fsdp world_size=1 batch.global=64 dry_run=true 2>&1 | grep -n "warning\|memory per rank" | tee $OUT/c3-fsdp-dry.txt
