#!/bin/bash
# Session 42, helper F, the one device call (one H200, issue 52): matmuls' bias adds through
# cuBLASLt's bias epilogue (NEW, branch s42-f) against main at the session's start (OLD,
# /tmp/s42-old), gpt2 batch 8.
#  0. torch.compile + SDPA (scripts/gpu_bench.py, gpt2 bf16) compiles in the background from
#     the start; its timed steps and every Ingot timing below hold one flock, so no two time at
#     once.
#  1. `ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01
#     --steps 20 --json`, OLD / NEW alternating, two rounds (median step, bytes, losses);
#     then NEW with INGOT_GEMM_EPILOGUE=0 (its fallbacks: the GEMM, then the bias kernel).
#  2. tf32 and f32, 5 steps each, OLD / NEW (losses).
#  3. The per-op profile of NEW's gpt2 bf16 SGD step (cuda_profile --top 40), then OLD's.
#  4. GPU tests (INGOT_REQUIRE_GPU=1): trainer cuda_epilogue, cuda_matmul_acc.
# usage: bash .device-bin/f/script.sh (beside it: bins.tar.xz, device_prelude.sh)
X=/tmp/f; D=$(cd "$(dirname "$0")" && pwd)
source $D/device_prelude.sh
END=232
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
O=$X/old; N=$X/new
export PYTHONPATH=$PWD/scripts INGOT_CACHE_DIR=$X/ptx
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
LOCK=$X/gpu.lock; : > $LOCK
( cd scripts; TORCH_BENCH_LOCK=$LOCK timeout $(left 205) python3 gpu_bench.py --models gpt2 --modes bf16 \
    --systems torch-compile-sdpa --steps 20 --warmup 5 --timeout 200 --json $X/torch.json > $X/torch.txt 2>&1
  echo "gpu_bench rc=$? [t=$(( $(date +%s) - START )) s]" >> $X/torch.txt ) &
G=$!
for b in old new; do
  timeout 60 $X/$b/ingot compile --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 \
    -o $X/$b.exe > $X/compile_$b.txt 2>&1 &
  eval C_$b=$!
done
train() {  # train NAME BIN PRECISION STEPS [ENV...]
  local name=$1 bin=$2 p=$3 s=$4; shift 4
  [ "$(left $END)" -gt 25 ] || { echo "$name: not run (time)"; return; }
  echo -n "$name: "
  env "$@" flock $LOCK timeout 25 $bin train --model gpt2 --device cuda --precision $p --optimizer sgd \
    --lr 0.01 --steps $s --json > $X/$name.json 2> $X/$name.err \
    && python3 scripts/summ.py < $X/$name.json || tail -3 $X/$name.err
  grep -E "gemm epilogue" $X/$name.err | tail -3
}
echo "== 1. gpt2 bf16 SGD lr 0.01, 20 steps, OLD / NEW alternating"
for r in 1 2; do
  train old_bf16_$r $O/ingot bf16 20
  train new_bf16_$r $N/ingot bf16 20
done
train new_bf16_off $N/ingot bf16 20 INGOT_GEMM_EPILOGUE=0
t
losses() {
python3 - "$@" <<'PY' || true
import json, sys
def losses(p):
    out = []
    try:
        for l in open(p):
            try: d = json.loads(l)
            except Exception: continue
            if isinstance(d, dict) and "loss" in d and "step" in d: out.append(d["loss"])
    except OSError: pass
    return out
o, n, o2, n2 = (losses(p) for p in sys.argv[1:5])
print("losses OLD", o); print("losses NEW", n)
print("OLD rounds identical:", o == o2, " NEW rounds identical:", n == n2)
print("largest relative difference NEW/OLD over %d steps: %.3e" % (len(o), max((abs(a - b) / abs(a) for a, b in zip(o, n)), default=0)))
PY
}
losses $X/old_bf16_1.json $X/new_bf16_1.json $X/old_bf16_2.json $X/new_bf16_2.json
echo "-- NEW with INGOT_GEMM_EPILOGUE=0 against OLD"
losses $X/old_bf16_1.json $X/new_bf16_off.json $X/old_bf16_1.json $X/new_bf16_off.json
echo "== 2. tf32 and f32, 5 steps, OLD / NEW"
for p in tf32 f32; do
  train old_$p $O/ingot $p 5
  train new_$p $N/ingot $p 5
  losses $X/old_$p.json $X/new_$p.json $X/old_$p.json $X/new_$p.json
done; t
wait $C_old; wait $C_new; tail -1 $X/compile_old.txt; tail -1 $X/compile_new.txt
echo "== 3. cuda_profile gpt2 bf16 SGD, NEW / OLD"
for b in new old; do
  [ "$(left $END)" -gt 55 ] || { echo "$b: not run (time)"; continue; }
  echo "-- $b"; flock $LOCK timeout 40 $X/$b/cuda_profile $X/$b.exe --top 40 > $X/prof_$b.txt 2>&1; echo "rc=$?"
  head -50 $X/prof_$b.txt
done; t
echo "== 4. GPU tests (NEW)"
for tb in test_cuda_epilogue test_cuda_matmul_acc; do
  [ "$(left $END)" -gt 20 ] || { echo "$tb: not run (time)"; continue; }
  INGOT_REQUIRE_GPU=1 flock $LOCK timeout $(( $(left $END) - 8 )) $N/$tb --test-threads=1 > $X/$tb.txt 2>&1
  echo "$tb rc=$? $(grep -E '^test result' $X/$tb.txt)"; grep -E "^test |FAILED|panicked|rel " $X/$tb.txt | head -40
done; t
echo "== 0. torch.compile + SDPA, gpt2 bf16"
wait $G  # its own timeout ends it by t = 205 s
grep -E "gpu_bench|ms|MiB" $X/torch.txt | tail -6
cp $X/prof_*.txt $X/torch.json $X/*.err $OUT/ 2>/dev/null
t; echo done
