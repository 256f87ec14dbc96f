#!/bin/bash
# Session 34, helper B, the one device call (one H200): column reductions a thread eight terms
# in flight and split over merged reduce axes (issue 52), NEW (branch s34-b) against OLD (main
# at 2889ba9, whose kernels are the branch's base).
#  1. NEW's kernels of gpt2 bf16 each against the CPU, timed (cuda_kernels).
#  2. gpt2 bf16 SGD lr 0.01 compiled to a step executable by each, profiled op by op,
#     OLD / NEW alternating (cuda_profile --top 40).
#  3. gpt2 bf16 SGD 30 steps, OLD / NEW alternating (median step, losses).
#  4. GPU tests with the time left: test_cuda_sums, test_cuda_kernels (gpt2), test_cuda_bf16
#     (every bf16 gpt2 kernel).
# usage: bash D/gpu-s34-b-script.sh, D holding new.tgz (NEW) and old.tgz (OLD) (the call
# carried them as .device-bin/s34b/ of the session's checkout, where it ran)
START=$(date +%s)
OUT=${OUT:-/tmp/s34b-out}; mkdir -p $OUT
X=/tmp/s34aux; mkdir -p $X  # only the log comes back
exec > >(tee -a $OUT/gpu-s34-b-log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-232} - $(date +%s) + START )); }
D=$(cd "$(dirname "$0")" && pwd)
mkdir -p $X/new $X/old && tar xzf $D/new.tgz -C $X/new && tar xzf $D/old.tgz -C $X/old
N=$X/new; O=$X/old
export INGOT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; nproc
for b in O N; do eval B=\$$b
  timeout 60 $B/ingot compile --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 -o $X/$b.exe > $X/compile_$b.txt 2>&1 &
done
echo "== 1. cuda_kernels --precision bf16 gpt2 (NEW)"
timeout 70 $N/cuda_kernels --precision bf16 gpt2 > $X/kernels.txt 2>&1; echo "rc=$?"
cat $X/kernels.txt; t
wait; tail -1 $X/compile_O.txt; tail -1 $X/compile_N.txt
echo "== 2. profile gpt2 bf16 SGD, OLD/NEW alternating"
for b in O N; do eval B=\$$b
  [ $(left) -gt 40 ] || { echo "$b: not run (time)"; continue; }
  echo "-- $b"; timeout 45 $B/cuda_profile $X/$b.exe --top 40 > $X/prof_$b.txt 2>&1; echo "rc=$?"
  head -46 $X/prof_$b.txt
done; t
echo "== 3. gpt2 bf16 SGD 30 steps, OLD/NEW alternating"
for i in 1 2; do for b in O N; do eval B=\$$b
  [ $(left) -gt 12 ] || { echo "$b $i: not run (time)"; continue; }
  echo -n "$b: "; timeout 20 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 30 --json > $X/train_${b}_$i.json 2>$X/g2.err && python3 $N/summ.py < $X/train_${b}_$i.json || tail -2 $X/g2.err
done; done
python3 - $X/train_O_1.json $X/train_N_1.json <<'PY' || true
import json, sys
def losses(p):
    out = []
    for l in open(p):
        try: d = json.loads(l)
        except Exception: continue
        if isinstance(d, dict) and "loss" in d: out.append(d["loss"])
    return out
o, n = losses(sys.argv[1]), losses(sys.argv[2])
print("losses OLD", o[:3], "...", o[-3:]); print("losses NEW", n[:3], "...", n[-3:])
print("largest relative difference over %d steps: %.3e" % (len(o), max((abs(a-b)/abs(a) for a, b in zip(o, n)), default=0)))
PY
t
echo "== 4. GPU tests (NEW), with the time left"
for tb in "test_cuda_sums" "test_cuda_kernels gpt2" "test_cuda_bf16 every_bf16_gpt2_kernel"; do
  set -- $tb
  [ -x $N/$1 ] || { echo "$1: not carried"; continue; }
  [ $(left) -gt 15 ] || { echo "$tb: not run (time)"; continue; }
  timeout $(left) $N/$1 $2 --test-threads=1 > $X/$1.txt 2>&1; echo "$tb rc=$?: $(grep -E '^test result' $X/$1.txt)"; grep -E "FAILED|panicked" $X/$1.txt | head -5
done; t
echo done
