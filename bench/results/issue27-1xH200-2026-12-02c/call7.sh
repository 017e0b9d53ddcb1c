set -x
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv; nproc; python3 -c "import torch; print(torch.__version__)"
R=.before/gpt_ddp_reference.py
for k in 1 2; do
  python3 bench/levers_bench.py --reference $R --only 1,2 --steps 42 --budget-s 200 --out $OUT/c7-pair$k.json > $OUT/c7-pair$k.txt 2>&1
  echo "pair $k rc $?"; grep -v '^\[{' $OUT/c7-pair$k.txt | tail -15
done
mkdir -p /tmp/sm && cd /tmp/sm && /usr/bin/time -f "smoke wall %e s" python3 -m ddp_runner task=smoke world_size=1 > $OUT/c7-smoke.txt 2>&1; echo "smoke rc $?"; tail -5 $OUT/c7-smoke.txt
