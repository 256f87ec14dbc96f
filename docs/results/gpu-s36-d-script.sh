#!/bin/bash
# Session 36, helper D (one H200), issue 48: a deterministic choice of each convolution's
# algorithm (cuDNN's heuristic order, no timing) and cuDNN + channels-last as the CUDA default.
#  A. (CPU and GPU at once, no timings) every executable compiled, 16 cores; meanwhile the GPU
#     tests of this branch, INGOT_REQUIRE_GPU=1: test_cuda_cudnn, test_cuda_channels_last,
#     test_cuda_conv, and cli's test_cuda grouped-convolution test.
#  B. (GPU alone) `ingot run EXE --steps 10 --json`, median step: NEW default against NEW
#     INGOT_CONV=im2col for resnet50 224 b128 bf16, resnet18 (CIFAR) f32 and bf16, cnn; OLD
#     (/tmp/s36-old, session 35) INGOT_CONV=cudnn (timed at load) for resnet50; NEW with
#     INGOT_CONV_TIMING=1 for resnet50 (the opt-in timing, for comparison).
#  C. the same executable run twice in two processes gives the same losses to the bit: the
#     cnn and resnet50 at side 64 batch 8 (bf16), and resnet50 224's two NEW default runs.
# usage: bash .device-bin/d/gpu-s36-d-script.sh (beside bins.tgz holding new/ and old/).
START=$(date +%s)
OUT=${OUT:-/tmp/s36d-out}; mkdir -p $OUT
X=/tmp/s36d; mkdir -p $X
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-165} - $(date +%s) + START )); }
D=$(cd "$(dirname "$0")" && pwd)
tar xzf $D/bins.tgz -C $X
N=$X/new; O=$X/old
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cudnn,os;print(os.path.join(nvidia.cudnn.__path__[0],"lib"))'):$LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
R50=resnet:depth=50,side=224,batch=128
R50S=resnet:depth=50,side=64,batch=8
echo "== A. compiles (background) and GPU tests"
comp() { # name binary conv model precision
  INGOT_CONV=$3 timeout 60 $2 compile --model $4 --device cuda --precision $5 -o $X/$1.ingot > $X/c_$1.txt 2>&1
  echo "compile $1 rc=$?" >> $X/compiles.txt; }
P=()
comp r50_new $N/ingot auto $R50 bf16 & P+=($!)
comp r50_im2col $N/ingot im2col $R50 bf16 & P+=($!)
comp r50_old $O/ingot cudnn $R50 bf16 & P+=($!)
comp r50s_new $N/ingot auto $R50S bf16 & P+=($!)
for p in f32 bf16; do
  comp r18${p}_new $N/ingot auto resnet18 $p & P+=($!)
  comp r18${p}_im2col $N/ingot im2col resnet18 $p & P+=($!)
done
comp cnn_new $N/ingot auto cnn f32 & P+=($!)
comp cnn_im2col $N/ingot im2col cnn f32 & P+=($!)
tst() { INGOT_REQUIRE_GPU=1 timeout 75 $N/$1 --test-threads=1 --nocapture $2 > $X/t_$1.txt 2>&1; echo "rc=$?" >> $X/t_$1.txt; }
tst test_cuda_cudnn & T1=$!
tst test_cuda_channels_last & T2=$!
tst test_cuda_conv & T3=$!
tst test_cuda grouped & T4=$!
for p in "${P[@]}"; do wait $p; done
cat $X/compiles.txt; ls -la $X/*.ingot | awk '{print $5, $9}'; t
wait $T1; wait $T2; wait $T3; wait $T4
for f in test_cuda_cudnn test_cuda_channels_last test_cuda_conv test_cuda; do
  echo "-- $f"; grep -E "^test |test result|panicked|FAILED|^rc=|cuDNN 9" $X/t_$f.txt | head -20
done
grep -h "convolution %" $X/t_test_cuda_channels_last.txt | head -4
t
echo "== B. step times (ingot run --steps 10 --json), GPU alone"
run() { # name binary exe conv [extra env]
  [ $(left) -gt 12 ] || { echo "skip $1 (time)"; return; }
  env INGOT_CONV=$4 $5 timeout 25 $2 run $X/$3.ingot --device cuda --steps 10 --json > $X/r_$1.json 2> $X/r_$1.err
  echo "$1 rc=$? $(python3 $O/summ.py < $X/r_$1.json 2>&1 || tail -2 $X/r_$1.err)"; }
run r50_new1 $N/ingot r50_new auto INGOT_LOG=1
run r50_im2col $N/ingot r50_im2col im2col
run r18f32_new $N/ingot r18f32_new auto
run r18f32_im2col $N/ingot r18f32_im2col im2col
run r18bf16_new $N/ingot r18bf16_new auto
run r18bf16_im2col $N/ingot r18bf16_im2col im2col
run cnn_new1 $N/ingot cnn_new auto
run cnn_im2col $N/ingot cnn_im2col im2col
run r50_old $O/ingot r50_old cudnn
run r50_new2 $N/ingot r50_new auto
t
echo "== C. the same executable twice, two processes"
run cnn_new2 $N/ingot cnn_new auto
run r50s_new1 $N/ingot r50s_new auto
run r50s_new2 $N/ingot r50s_new auto
same() { python3 - $X/r_$1.json $X/r_$2.json $O <<'EOF'
import sys; sys.path.insert(0, sys.argv[3]); from summ import read_run
a, _ = read_run(open(sys.argv[1])); b, _ = read_run(open(sys.argv[2]))
print(sys.argv[1].split('/')[-1], sys.argv[2].split('/')[-1], "losses", len(a), len(b),
      "SAME BITS" if a == b and a else "DIFFER", a[-1:] , b[-1:])
EOF
}
same cnn_new1 cnn_new2; same r50s_new1 r50s_new2; same r50_new1 r50_new2
echo "-- resnet50 224 NEW default: choices (INGOT_LOG)"
grep -c "convolution %" $X/r_r50_new1.err
grep -o "convolution %[0-9]* ([a-z]*): [^,;]*" $X/r_r50_new1.err | sed 's/.*): //; s/, workspace.*//' | sort | uniq -c
grep -iE "error|warning" $X/r_r50_new1.err | head -3
t
echo "== D. NEW with INGOT_CONV_TIMING=1 (opt-in), resnet50"
run r50_timed $N/ingot r50_new auto "INGOT_CONV_TIMING=1 INGOT_LOG=1"
grep -o "convolution %[0-9]* ([a-z]*): [^,;]*" $X/r_r50_timed.err | sed 's/.*): //; s/, workspace.*//' | sort | uniq -c
grep -m1 "INGOT_CONV_TIMING" $X/r_r50_timed.err
echo done; t
