#!/bin/bash
# Run by the device tool from the checkout's root, with .proj/ carried: .proj/snap held the package as installed
# (runner/ as ddp_runner/, tasks/ as ddp_runner/tasks/, conf/ as ddp_runner/conf/) and .proj/whl Hydra's wheels.
# Issue 44's CPU check on a quiet host, repeated: the 1-2-3-4 fixed-global-batch sweep of the tiny GPT on free
# cores and held to 2 (taskset), twice each, 150 steps; a wider GPT (comm a larger share); ddp-doctor at 2 and 4.
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .proj/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$R/.proj/snap PYTHONUNBUFFERED=1
uptime; cd /tmp
S="-m experiment=fixed_global_batch world_size=1,2,3,4 task=gpt device=cpu batch.per_rank=2 batch.global=24 data.val_fraction=0.002"
for n in 2 4; do timeout 60 python3 -m ddp_runner.diagnostics.doctor --device cpu --nproc $n --json > $OUT/doctor-cpu$n.json 2>/dev/null; echo "doctor $n rc $?"; done
run() { local name=$1; shift; date -u +%T; timeout 170 "$@" output.root=/tmp/$name > /tmp/$name.log 2>&1; echo "$name rc $?"; }
run free1 python3 -m ddp_runner $S train.max_steps=150 train.log_every=10
run two1 taskset -c 0,1 python3 -m ddp_runner $S train.max_steps=150 train.log_every=10
run free2 python3 -m ddp_runner $S train.max_steps=150 train.log_every=10
run two2 taskset -c 0,1 python3 -m ddp_runner $S train.max_steps=150 train.log_every=10
run wide python3 -m ddp_runner $S task.model.width=256 task.model.layers=4 task.model.heads=4 train.max_steps=40 train.log_every=5
date -u +%T
tar -czf $OUT/runs2.tgz --exclude=checkpoints --exclude=tb --exclude=.compile_cache free1 two1 free2 two2 wide *.log
ls -la $OUT
