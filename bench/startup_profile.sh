#!/usr/bin/env bash
# Where a GPT-2 small job's time to first step goes, on a freshly started GPU machine (issue 14, item 6):
# the reference's time to first step, then two jobs under one fresh output root (cold, then warm compile cache),
# the driver's own checks under cProfile (a dry run), and one more cold job under py-spy (every process, when
# py-spy is installed). Usage: bench/startup_profile.sh <out dir> [ddp-run overrides...]
set -u
out=$1; shift
mkdir -p "$out"
work=$(mktemp -d /tmp/startup-XXXX)
python3 bench/scaling_study.py --reference .ref/gpt_ddp_reference.py --out "$out/ref" --work "$work/ref" \
    --parts a --worlds 1 --steps 20 > "$out/ref.log" 2>&1
for j in 1 2; do
    python3 -m ddp_runner task=gpt2_small world_size=1 train.max_steps=20 output.root="$work/r1" "$@" > "$out/job$j.log" 2>&1
done
python3 -m cProfile -o "$out/driver.prof" -m ddp_runner task=gpt2_small world_size=1 dry_run=true \
    output.root="$work/r1" "$@" > "$out/dry.log" 2>&1
if command -v py-spy > /dev/null; then
    py-spy record --subprocesses --rate 100 --format raw -o "$out/spy.txt" -- python3 -m ddp_runner task=gpt2_small \
        world_size=1 train.max_steps=10 output.root="$work/r2" "$@" > "$out/spy.log" 2>&1
fi
(cd "$work" && find . \( -name summary.json -o -name run.json -o -name '*.log' \) -print0 | tar -czf "$out/runs.tgz" --null -T -)
