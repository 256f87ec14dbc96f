#!/bin/bash
# Session 44, helper C, the one device call (one H200, issue 52): bf16 attention backward with
# dq from the ds that dkdv stores (NEW, branch s44-c) against main at the session's start
# (OLD, /tmp/s44-old), gpt2 bf16 batch 8. Budget 200 s:
#  1. The GPU attention test (runtime/tests/cuda_attention.rs, NEW, INGOT_REQUIRE_GPU=1) while
#     OLD's and NEW's gpt2 bf16 steps compile on the CPU (nothing else on the GPU meanwhile).
#  2. `ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01
#     --steps 20 --json`, OLD / NEW alternating, two rounds (scripts/summ.py; losses compared).
#  3. attention_bench (B=8 H=12 T=1024 D=64 causal, each kernel alone), OLD / NEW; SDPA's
#     part (python) with NEW only.
#  4. cuda_profile of the gpt2 bf16 SGD step, OLD / NEW (--top 30), as time allows.
# usage: bash .device-bin/c/script.sh (beside it: bins.tar.xz, device_prelude.sh)
X=/tmp/c; D=$(cd "$(dirname "$0")" && pwd)
source $D/device_prelude.sh
END=192
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
O=$X/old; N=$X/new
export PYTHONPATH=$PWD/scripts INGOT_CACHE_DIR=$X/ptx
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
echo "== 1. GPU attention test (NEW) while both steps compile"
( INGOT_REQUIRE_GPU=1 timeout 85 $N/test_cuda_attention --test-threads=1 > $X/t_attn.txt 2>&1
  echo "rc=$?" >> $X/t_attn.txt ) &
TP=$!
for b in old new; do
  timeout 80 $X/$b/ingot compile --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 \
    -o $X/$b.exe > $X/compile_$b.txt 2>&1 &
  eval C_$b=$!
done
wait $C_old; wait $C_new; tail -1 $X/compile_old.txt; tail -1 $X/compile_new.txt; t
wait $TP
grep -E "^test |test result|largest error|rc=|FAILED|panicked|Bf16" $X/t_attn.txt | cut -c1-240 | head -40; t
echo "== 2. gpt2 bf16 SGD lr 0.01, 20 steps, OLD / NEW alternating"
for r in 1 2; do for b in old new; do
  [ "$(left $END)" -gt 20 ] || { echo "round $r $b: not run (time)"; continue; }
  echo -n "round $r $b: "
  timeout 25 $X/$b/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 \
    --steps 20 --json > $X/train_${b}_$r.json 2> $X/train_${b}_$r.err \
    && python3 scripts/summ.py < $X/train_${b}_$r.json || tail -2 $X/train_${b}_$r.err
done; done; t
python3 - $X/train_old_1.json $X/train_new_1.json $X/train_old_2.json $X/train_new_2.json <<'PY' || true
import sys
from summ import read_run
o, n, o2, n2 = (read_run(open(p))[0] for p in sys.argv[1:5])
print("losses OLD", o); print("losses NEW", n)
print("OLD rounds identical:", o == o2, " NEW rounds identical:", n == n2, " NEW == OLD:", o == n)
print("largest relative difference NEW/OLD over %d steps: %.3e" % (len(o), max((abs(a - b) / abs(a) for a, b in zip(o, n)), default=0)))
PY
echo "== 3. attention_bench 8 12 1024 64, OLD / NEW (SDPA's part with NEW only: OLD's TMPDIR"
echo "   does not exist, so it cannot write its python script and skips it)"
for b in old new; do
  [ "$(left $END)" -gt 25 ] || { echo "$b: not run (time)"; continue; }
  echo "-- $b"
  if [ $b = old ]; then TD=/nonexistent-c; else TD=$X; fi
  TMPDIR=$TD timeout 30 $X/$b/attention_bench 8 12 1024 64 > $X/bench_$b.txt 2>&1; echo "rc=$?"
  grep -E "^\| (ingot|SDPA|Bf16)|device:|Bf16:|no SDPA" $X/bench_$b.txt | cut -c1-200
done; t
echo "== 4. cuda_profile gpt2 bf16 SGD, OLD / NEW"
for b in old new; do
  [ "$(left $END)" -gt 30 ] || { echo "$b: not run (time)"; continue; }
  echo "-- $b"; timeout $(( $(left $END) - 5 )) $X/$b/cuda_profile $X/$b.exe --top 30 > $X/prof_$b.txt 2>&1; echo "rc=$?"
  head -40 $X/prof_$b.txt | cut -c1-200
done; t
cp $X/t_attn.txt $X/bench_*.txt $X/prof_*.txt $X/train_*.json $OUT/ 2>/dev/null
t; echo done
