#!/bin/bash
# Run by the device tool from the checkout's root, with .proj/ carried: .proj/snap held the package as installed
# (runner/ as ddp_runner/, tasks/ as ddp_runner/tasks/, conf/ as ddp_runner/conf/) and .proj/whl Hydra's wheels.
# Issue 44's CPU check on a quiet host: the 1-2-3-4 fixed-global-batch sweep of the tiny GPT on 16 free cores and
# again held to 2 cores (taskset), ddp-doctor's gloo all-reduce, and ddp-compare --project over each sweep.
set -x
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .proj/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$R/.proj/snap PYTHONUNBUFFERED=1
nproc; python3 -c "import torch, sys; print(torch.__version__, sys.version)"; uptime
SWEEP="-m experiment=fixed_global_batch world_size=1,2,3,4 task=gpt device=cpu train.max_steps=60 train.log_every=5 batch.per_rank=2 batch.global=24 data.val_fraction=0.002"
cd /tmp
python3 -m ddp_runner.diagnostics.doctor --device cpu --nproc 2 --json > $OUT/doctor-cpu2.json 2>$OUT/doctor.err; echo "doctor rc $?"
date -u; python3 -m ddp_runner $SWEEP output.root=/tmp/free > $OUT/sweep-free.log 2>&1; echo "free rc $?"; date -u
taskset -c 0,1 python3 -m ddp_runner $SWEEP output.root=/tmp/two > $OUT/sweep-two.log 2>&1; echo "two rc $?"; date -u
for s in free two; do
  python3 -m ddp_runner.report.compare /tmp/$s --out /tmp/cmp-$s --project 8,64,512 > /tmp/cmp-$s.txt 2>&1; echo "compare $s rc $?"
  sed -n '/# Scaling projection/,/^| ranks | step/p' /tmp/cmp-$s.txt
done
tar -czf $OUT/runs.tgz --exclude=checkpoints --exclude=tb --exclude=.compile_cache -C /tmp free two cmp-free cmp-two
ls -la $OUT
