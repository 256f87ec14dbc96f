#!/bin/bash
# Session 28 (issue 52): the larger GPTs in bf16 on one H200, Ingot beside PyTorch torch.compile +
# SDPA (scripts/gpu_bench.py), at the largest power-of-two batch both fit: step time, peak
# memory, TFLOP/s (the step's model FLOPs over the median step, the same count for both; Ingot's
# own log gives it too, with the fraction of the H200's dense bf16 peak, 989.4 TFLOP/s).
#
# usage: bash docs/results/gpu-s28-larger-gpts-script.sh   (one H200, at most 8 minutes;
#        needs .devbin/ingot, python3 with torch; writes only under $OUT and /tmp)
#
# How the batch is chosen, per model:
#  1. Ingot: the largest power of two B whose default plan (`ingot plan --batch B`, bf16, CUDA:
#     the plan `train --batch B` runs, the "cheap recomputation" row of `ingot plan --max-batch`)
#     fits the GPU's memory less 6 GiB (CUDA context, cuBLAS, the captured step graph, room to
#     spare). Planned on the CPU beforehand within 137,627 MiB (an H200's 143,771 less 6 GiB):
#     gpt2-medium 128 (103.4 GiB; 256 needs 201.4 GiB), gpt-1.3b 64 (110.3 GiB; 128 needs
#     202.0 GiB). `--max-batch` itself searches three ways and takes minutes for these models;
#     doubling by powers of two takes a second a plan.
#  2. PyTorch (torch.compile + SDPA, AdamW foreach, bf16 autocast) at B; if that cell runs out
#     of memory, at B/2, and so on: the first batch it runs at is the common batch (any other
#     failure stops the model, and the log shows it).
#  3. Ingot at the common batch, the same steps; then, if time is left and Ingot's own B is
#     larger, Ingot alone at B (what the plan lets it train that PyTorch cannot).
# A model with no time left for its cells is skipped, and the log says so.
START=$(date +%s)
OUT=${OUT:-/tmp/s28-larger-gpts}
mkdir -p "$OUT"
INGOT=$PWD/.devbin/ingot
BENCH=$PWD/scripts/gpu_bench.py
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-2}
LIMIT=${LIMIT:-470}
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { [ $(( $(date +%s) - START )) -lt $(( LIMIT - $1 )) ]; }
exec > >(tee "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
TOTAL_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
BUDGET="$(( TOTAL_MIB - 6144 ))MiB"
echo "budget for the plan: $BUDGET (the GPU's $TOTAL_MIB MiB less 6 GiB)"

BUDGET_BYTES=$(( (TOTAL_MIB - 6144) * 1048576 ))
planned() {  # the planned total of model $1 at batch $2 (bf16, CUDA), in bytes
  timeout 60 "$INGOT" plan --model "$1" --device cuda --precision bf16 --batch "$2" --json \
    | python3 -c "import json, sys; print(json.load(sys.stdin)['total_bytes'])"
}

for M in gpt2-medium gpt-1.3b; do
  echo "== $M: the largest power-of-two batch whose plan fits $BUDGET (bf16)"
  B=0; N=1
  while true; do
    P=$(planned "$M" "$N")
    [ -n "$P" ] || { echo "$M: ingot plan failed at batch $N"; break; }
    echo "$M batch $N: planned $P bytes" | tee -a "$OUT/$M-plans.txt"
    [ "$P" -le "$BUDGET_BYTES" ] || break
    B=$N; N=$(( N * 2 ))
  done
  if [ "$B" -lt 1 ]; then echo "$M: no batch fits; skipped"; continue; fi
  echo "$B" > "$OUT/$M-ingot-batch.txt"
  echo "$M: Ingot's largest power-of-two batch $B"; t
  TB=""
  while [ "$B" -ge 1 ] && left 150; do
    echo "== $M: torch.compile + SDPA at batch $B"
    python3 "$BENCH" --ingot "$INGOT" --systems torch-compile-sdpa --modes bf16 --models "$M" --batch "$B" \
      --steps "$STEPS" --warmup "$WARMUP" --timeout 240 --json "$OUT/$M-torch-b$B.json" 2>&1 | grep "gpu_bench: \["
    R=$(python3 -c "
import json, sys
cells = json.load(open(sys.argv[1]))['cells']
ok = bool(cells) and all(c['ok'] for c in cells)
oom = any('out of memory' in (c.get('error', '') + c.get('stderr_tail', '')).lower() for c in cells)
print('ok' if ok else 'oom' if oom else 'failed')" "$OUT/$M-torch-b$B.json" 2>/dev/null)
    if [ "$R" = ok ]; then TB=$B; break; fi
    if [ "$R" != oom ]; then echo "$M: PyTorch failed at batch $B, not for memory: stopped"; break; fi
    echo "$M: PyTorch out of memory at batch $B"
    B=$(( B / 2 ))
  done
  t
  if [ -z "$TB" ]; then echo "$M: PyTorch ran at no batch in the time left"; continue; fi
  if left 40; then
    echo "== $M: Ingot at batch $TB"
    python3 "$BENCH" --ingot "$INGOT" --systems ingot --modes bf16 --models "$M" --batch "$TB" \
      --steps "$STEPS" --warmup "$WARMUP" --timeout 120 --json "$OUT/$M-ingot-b$TB.json" 2>&1 | grep "gpu_bench: \["
    t
  fi
done
for M in gpt2-medium gpt-1.3b; do
  IB=$(cat "$OUT/$M-ingot-batch.txt" 2>/dev/null)
  [ -n "$IB" ] || continue
  if ! ls "$OUT/$M-ingot-b$IB.json" >/dev/null 2>&1 && left 60; then
    echo "== $M: Ingot alone at its own power-of-two batch $IB"
    python3 "$BENCH" --ingot "$INGOT" --systems ingot --modes bf16 --models "$M" --batch "$IB" \
      --steps "$STEPS" --warmup "$WARMUP" --timeout 120 --json "$OUT/$M-ingot-b$IB.json" 2>&1 | grep "gpu_bench: \["
    t
  fi
done
echo "== all cells"
python3 "$BENCH" --table "$OUT"/*-b*.json
echo "== Ingot's own rate (its summary: model FLOPs over the median device step, fraction of the peak)"
for f in "$OUT"/*-ingot-b*.json; do
  python3 -c "
import json, sys
for c in json.load(open(sys.argv[1]))['cells']:
    s = (c.get('result') or {}).get('summary') or {}
    print(c['model'], c['mode'], 'tflops', s.get('tflops'), 'peak_fraction', s.get('peak_fraction'), 'model_flops', s.get('model_flops'), 'planned', s.get('planned_bytes'), 'measured', s.get('measured_bytes'))
" "$f"
done
t
echo "done"
