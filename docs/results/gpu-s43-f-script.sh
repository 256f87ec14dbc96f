#!/bin/bash
# Session 43, helper F, the one device call (one H200, issue 52): gpt2's bf16 qkv bias adds as
# cuBLASLt's bias epilogue, the f32 bias rounded to bf16 into the GEMM's workspace tail first
# (NEW, branch s43-f) against main at the session's start (OLD, /tmp/s43-old), gpt2 batch 8.
#  0. gemm_epilogue_probe: what cuBLASLt accepts for bf16 (BIAS, GELU_BIAS, GELU_AUX_BIAS,
#     BGRADA, BGRADB; bias unset, bf16, f32) at gpt2's shapes, and one small bf16 GEMM with a
#     bf16 bias run and compared with the host (one rounding or two).
#  1. `ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01
#     --steps 20 --json`, OLD / NEW (epilogues off, the default) / NEW with
#     INGOT_GEMM_EPILOGUE=1, alternating, two rounds (median step, bytes, losses).
#  2. tf32, 5 steps, OLD / NEW with INGOT_GEMM_EPILOGUE=1, two rounds (for the default).
#  3. The per-op profile of NEW's gpt2 bf16 SGD step with the epilogues on (cuda_profile --top 20).
#  4. GPU tests (INGOT_REQUIRE_GPU=1, INGOT_GEMM_EPILOGUE=1): trainer cuda_epilogue,
#     cuda_matmul_acc; cuda_epilogue again with the epilogues off.
# usage: bash .device-bin/f/script.sh (beside it: bins.tar.xz, device_prelude.sh)
X=/tmp/f; D=$(cd "$(dirname "$0")" && pwd)
source $D/device_prelude.sh
END=190
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
O=$X/old; N=$X/new
export PYTHONPATH=$PWD/scripts INGOT_CACHE_DIR=$X/ptx
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
for b in old new; do
  timeout 60 $X/$b/ingot compile --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 \
    -o $X/$b.exe > $X/compile_$b.txt 2>&1 &
  eval C_$b=$!
done
echo "== 0. cuBLASLt's bf16 epilogues (gemm_epilogue_probe)"
timeout 30 $N/gemm_epilogue_probe > $X/probe.txt 2>&1; echo "rc=$?"
cat $X/probe.txt; t
train() {  # train NAME BIN PRECISION STEPS [ENV...]
  local name=$1 bin=$2 p=$3 s=$4; shift 4
  [ "$(left $END)" -gt 25 ] || { echo "$name: not run (time)"; return; }
  echo -n "$name: "
  env "$@" timeout 25 $bin train --model gpt2 --device cuda --precision $p --optimizer sgd \
    --lr 0.01 --steps $s --json > $X/$name.json 2> $X/$name.err \
    && python3 scripts/summ.py < $X/$name.json || tail -3 $X/$name.err
  grep -E "gemm epilogue" $X/$name.err | sort | uniq -c | sort -rn | head -3
}
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
echo "== 1. gpt2 bf16 SGD lr 0.01, 20 steps, OLD / NEW off / NEW on, alternating"
for r in 1 2; do
  train old_bf16_$r $O/ingot bf16 20
  train new_bf16_off_$r $N/ingot bf16 20
  train new_bf16_on_$r $N/ingot bf16 20 INGOT_GEMM_EPILOGUE=1
done; t
echo "-- NEW with INGOT_GEMM_EPILOGUE=1 against OLD"
losses $X/old_bf16_1.json $X/new_bf16_on_1.json $X/old_bf16_2.json $X/new_bf16_on_2.json
echo "-- NEW, epilogues off (the default), against OLD"
losses $X/old_bf16_1.json $X/new_bf16_off_1.json $X/old_bf16_2.json $X/new_bf16_off_2.json
echo "== 2. gpt2 tf32, 5 steps, OLD / NEW on, alternating"
for r in 1 2; do
  train old_tf32_$r $O/ingot tf32 5
  train new_tf32_on_$r $N/ingot tf32 5 INGOT_GEMM_EPILOGUE=1
done
losses $X/old_tf32_1.json $X/new_tf32_on_1.json $X/old_tf32_2.json $X/new_tf32_on_2.json; t
wait $C_old; wait $C_new; tail -1 $X/compile_old.txt; tail -1 $X/compile_new.txt
echo "== 3. cuda_profile gpt2 bf16 SGD, NEW with INGOT_GEMM_EPILOGUE=1"
if [ "$(left $END)" -gt 60 ]; then
  INGOT_GEMM_EPILOGUE=1 timeout 40 $N/cuda_profile $X/new.exe --top 20 > $X/prof_new.txt 2>&1; echo "rc=$?"
  grep -c "gemm epilogues: 12 through cuBLASLt" $X/prof_new.txt
  grep -v "gemm epilogue" $X/prof_new.txt | head -45
else echo "not run (time)"; fi; t
echo "== 4. GPU tests (NEW, INGOT_GEMM_EPILOGUE=1)"
for tb in test_cuda_epilogue test_cuda_matmul_acc; do
  [ "$(left $END)" -gt 20 ] || { echo "$tb: not run (time)"; continue; }
  INGOT_GEMM_EPILOGUE=1 INGOT_REQUIRE_GPU=1 timeout $(( $(left $END) - 8 )) $N/$tb --test-threads=1 --nocapture > $X/$tb.txt 2>&1
  echo "$tb rc=$? $(grep -E '^test result' $X/$tb.txt)"; grep -E "^test |FAILED|panicked|rel |gemm epilogues" $X/$tb.txt | sort | uniq -c | head -20
done
if [ "$(left $END)" -gt 20 ]; then
  INGOT_REQUIRE_GPU=1 timeout $(( $(left $END) - 8 )) $N/test_cuda_epilogue --test-threads=1 > $X/epi_off.txt 2>&1
  echo "test_cuda_epilogue, epilogues off: rc=$? $(grep -E '^test result' $X/epi_off.txt)"
fi; t
cp $X/prof_new.txt $X/probe.txt $OUT/ 2>/dev/null
t; echo done
