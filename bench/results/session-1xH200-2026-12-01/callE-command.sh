set -x
mkdir -p /tmp/r; date -u
python3 -m runner task=gpt_6b world_size=1 strategy=ddp dry_run=true output.root=/tmp/o > /tmp/r/refused-ddp.log 2>&1; echo "ddp rc=$?"
python3 -m runner task=gpt_6b world_size=1 dry_run=true output.root=/tmp/o > /tmp/r/refused-fsdp.log 2>&1; echo "fsdp rc=$?"
cat /tmp/r/refused-ddp.log /tmp/r/refused-fsdp.log | grep -v "^\s*$" | tail -14
FIX=$(python3 -c "
import sys; sys.path.insert(0, 'bench'); import refused_plan as r
print(' '.join(r.fixed_args(['task=gpt_6b', 'world_size=1'], open('/tmp/r/refused-ddp.log').read())))")
echo "FIX: $FIX"; date -u
timeout 420 python3 bench/memory_peak.py --out /tmp/r/mem-gpt_6b-fsdp1.json -- $FIX train.max_steps=6 train.log_every=1 checkpoint.final=false train.val_every=0 > /tmp/r/mem.log 2>&1; echo "mem rc=$?"
date -u
python3 -c "
import json; d=json.load(open('/tmp/r/mem-gpt_6b-fsdp1.json')); e=d.get('estimate') or {}
print('rc', d['rc'], 'peak', d.get('reported_peak_gb'), 'replay', (d.get('replay') or {}).get('peak_gb'), 'planned', e.get('total_gb'), 'tok/s', d.get('tok_s')); print(d.get('tail','')[-1500:])"
