#!/bin/bash
# Session 37, helper E, call 1 (one H200, issue 52): where gpt2-medium's bf16 step goes, Ingot
# (main at the session's start, /tmp/s37-old binaries) beside torch.compile + SDPA, both with
# SGD lr 0.01: 4 layers of gpt2-medium's widths at batch 16 (the per-layer GEMMs and attention
# as in 24 layers), op by op (cuda_profile) and through torch.profiler
# (scripts/torch_step_profile.py); then the whole gpt2-medium at batch 16, Ingot's step.
# usage: bash .device-bin/e/call1.sh   (binaries and the Python script in .device-bin/e)
X=/tmp/e; source scripts/device_prelude.sh
B=$PWD/.device-bin/e
M4="gpt:vocab=50304,d_model=1024,layers=4,heads=16,d_ff=4096,seq=1024,batch=16"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== Ingot (old) compile $M4, bf16, sgd"
timeout 60 $B/ingot compile --model "$M4" --device cuda --precision bf16 --optimizer sgd --lr 0.01 -o $X/m4.exe 2>&1 | tail -2; t
echo "== cuda_profile $M4"
timeout 60 $B/cuda_profile $X/m4.exe --top 60 2>&1 | head -80; t
echo "== torch.compile + SDPA + SGD profile $M4"
cp scripts/torch_reference.py $B/ 2>/dev/null
timeout $(left 150) python3 $B/torch_step_profile.py "$M4" --top 30 2>&1 | grep -v -i "warn" | head -120; t
if [ "$(left 165)" -gt 25 ]; then
echo "== Ingot (old) train gpt2-medium batch 16, bf16, sgd, 12 steps"
timeout $(left 165) $B/ingot train --model gpt2-medium --batch 16 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 12 --json 2>/dev/null | python3 -c "
import json,sys
rows=[json.loads(l) for l in sys.stdin if l.startswith('{')]
steps=[r for r in rows if 'step' in r]
s=[r['summary'] for r in rows if 'summary' in r]
print('losses', [round(r['loss'],5) for r in steps])
if s: print({k:s[0].get(k) for k in ('median_step_seconds','planned_bytes','measured_bytes','tflops','peak_fraction')})
"; t
fi
echo done
