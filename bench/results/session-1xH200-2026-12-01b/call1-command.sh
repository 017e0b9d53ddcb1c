set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH
R=$OUT/r; mkdir -p $R
date -u > $R/date.txt; git log -1 --format=%H > $R/commit.txt 2>/dev/null; nvidia-smi > $R/nvidia-smi.txt
python3 -c "import torch;print(torch.__version__, torch.cuda.get_device_name(0))" >> $R/date.txt
T0=$(date +%s.%N) timeout 200 torchrun --nproc-per-node=1 .ref/gpt_ddp_reference.py --compile --global-seqs 64 --micro 16 --steps 30 > $R/reference_w1.txt 2>&1
timeout 330 python3 bench/strategy_bench.py --worlds 1 --only small --steps 20 --out $R/strategy_w1_small.json > $R/strategy_w1_small.txt 2>&1
date -u >> $R/date.txt
tar czf $OUT/call1.tgz -C $OUT r
tail -15 $R/strategy_w1_small.txt; tail -3 $R/reference_w1.txt
