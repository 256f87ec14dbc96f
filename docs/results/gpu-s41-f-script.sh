#!/bin/bash
# Session 41, helper F, the one device call (one H200, issue 52): the bf16 kernels' exp and
# tanh by the hardware's approximations (`ig_exp`, `ig_tanh`; NEW, branch s41-f) against main
# at the session's start (OLD, /tmp/s41-old), gpt2 bf16 batch 8.
#  0. torch.compile + SDPA (scripts/gpu_bench.py, gpt2 bf16) compiles in the background from
#     the start; its timed steps and every Ingot timing below hold one flock, so no two time at
#     once.
#  1. NEW's distinct gpt2 bf16 kernels, each against the CPU and timed (cuda_kernels).
#  2. The per-op profile of the gpt2 bf16 SGD step, OLD / NEW (cuda_profile --top 40).
#  3. `ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01
#     --steps 20 --json`, OLD / NEW alternating, two rounds (median step, bytes, losses).
#  4. The GPU test of every bf16 gpt-mini kernel against the CPU (NEW, INGOT_REQUIRE_GPU=1).
# usage: bash .device-bin/f/script.sh (beside it: bins.tar.xz, device_prelude.sh)
X=/tmp/f; D=$(cd "$(dirname "$0")" && pwd)
source $D/device_prelude.sh
END=262
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
O=$X/old; N=$X/new
export PYTHONPATH=$PWD/scripts INGOT_CACHE_DIR=$X/ptx
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
LOCK=$X/gpu.lock; : > $LOCK
( cd scripts; TORCH_BENCH_LOCK=$LOCK timeout $(left 235) python3 gpu_bench.py --models gpt2 --modes bf16 \
    --systems torch-compile-sdpa --steps 20 --warmup 5 --timeout 230 --json $X/torch.json > $X/torch.txt 2>&1
  echo "gpu_bench rc=$? [t=$(( $(date +%s) - START )) s]" >> $X/torch.txt ) &
G=$!
for b in old new; do
  timeout 60 $X/$b/ingot compile --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 \
    -o $X/$b.exe > $X/compile_$b.txt 2>&1 &
  eval C_$b=$!
done
echo "== 1. cuda_kernels --precision bf16 gpt2 (NEW)"
flock $LOCK timeout 75 $N/cuda_kernels --precision bf16 gpt2 > $X/kernels.txt 2>&1; echo "rc=$?"
cut -c1-260 $X/kernels.txt; t
wait $C_old; wait $C_new; tail -1 $X/compile_old.txt; tail -1 $X/compile_new.txt
echo "== 2. cuda_profile gpt2 bf16 SGD, OLD / NEW"
for b in old new; do
  [ "$(left $END)" -gt 60 ] || { echo "$b: not run (time)"; continue; }
  echo "-- $b"; flock $LOCK timeout 40 $X/$b/cuda_profile $X/$b.exe --top 40 > $X/prof_$b.txt 2>&1; echo "rc=$?"
  head -48 $X/prof_$b.txt
done; t
echo "== 3. gpt2 bf16 SGD lr 0.01, 20 steps, OLD / NEW alternating"
for r in 1 2; do for b in old new; do
  [ "$(left $END)" -gt 25 ] || { echo "round $r $b: not run (time)"; continue; }
  echo -n "round $r $b: "
  flock $LOCK timeout 25 $X/$b/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 \
    --steps 20 --json > $X/train_${b}_$r.json 2> $X/train_${b}_$r.err \
    && python3 scripts/summ.py < $X/train_${b}_$r.json || tail -2 $X/train_${b}_$r.err
done; done; t
python3 - $X/train_old_1.json $X/train_new_1.json $X/train_old_2.json $X/train_new_2.json <<'PY' || true
import json, sys
def losses(p):
    out = []
    for l in open(p):
        try: d = json.loads(l)
        except Exception: continue
        if isinstance(d, dict) and "loss" in d and "step" in d: out.append(d["loss"])
    return out
o, n, o2, n2 = (losses(p) for p in sys.argv[1:5])
print("losses OLD", o); print("losses NEW", n)
print("OLD rounds identical:", o == o2, " NEW rounds identical:", n == n2)
print("largest relative difference NEW/OLD over %d steps: %.3e" % (len(o), max((abs(a - b) / abs(a) for a, b in zip(o, n)), default=0)))
PY
echo "== 4. GPU test: every bf16 gpt-mini kernel against the CPU (NEW)"
if [ ! -x $N/test_cuda_bf16 ]; then echo "not carried (not built in time)"
elif [ "$(left $END)" -gt 20 ]; then
  INGOT_REQUIRE_GPU=1 timeout $(( $(left $END) - 8 )) $N/test_cuda_bf16 --test-threads=1 every_bf16_gpt_mini_kernel > $X/t_bf16.txt 2>&1
  echo "rc=$? $(grep -E '^test result' $X/t_bf16.txt)"; grep -E "^test |FAILED|panicked" $X/t_bf16.txt | head -5
else echo "not run (time)"; fi; t
echo "== 0. torch.compile + SDPA, gpt2 bf16"
wait $G  # its own timeout ends it by t = 235 s
grep -E "gpu_bench" $X/torch.txt | tail -3
cp $X/kernels.txt $X/prof_*.txt $X/torch.json $OUT/ 2>/dev/null
t; echo done
