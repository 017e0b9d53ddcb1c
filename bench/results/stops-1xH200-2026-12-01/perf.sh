#!/usr/bin/env bash
# GPT-2 small on one GPU after issues 28/29 (stop vote, extra metrics, console records, one package): this tree
# (new, installed from its wheel) and c604496 (old, in .before/) alternately, with the hand-written reference between.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
N=$PWD; B=$PWD/.before; S=${STEPS:-30}
nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__)'; date -u
ours() { local tree=$1 label=$2 path=$3; (cd "$tree" && PYTHONPATH="$path" timeout 200 python3 bench/gpt_bench.py --steps "$S" --worlds 1 --label "$label" --out "$OUT/$label.json") > "$OUT/$label.log" 2>&1; echo "== $label rc=$? $(date -u +%T)"; grep -E '^\| (new|old)' "$OUT/$label.log"; }
ours "$N" new1 /tmp/site
ours "$B" old1 "$B:/tmp/site"
(cd "$N" && PYTHONPATH=/tmp/site timeout 150 python3 bench/gpt_bench.py --steps "$S" --worlds 1 --no-ours --reference "$B/gpt_ddp_reference.py" --out "$OUT/ref.json") > "$OUT/ref.log" 2>&1; echo "== ref rc=$? $(date -u +%T)"; grep -E '^\| reference' "$OUT/ref.log"
ours "$N" new2 /tmp/site
ours "$B" old2 "$B:/tmp/site"
