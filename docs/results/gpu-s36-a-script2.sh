#!/bin/bash
# Session 36, helper A (one H200), call 2, issue 48. Three builds:
#   NEW1: s36-a 8a81dc2, unread fused-kernel outputs no longer stored (fuse/unread.rs);
#   NEW2: NEW1 + fuse/sums.rs (a sum that waits for an earlier reduction only through
#         row-level factors split into sums that do not: batch norm's backward, 3 passes -> 2);
#   OLD:  main before the session (f2acfaa's build, /tmp/s36-old).
#  1. resnet50 224 bf16 batch 128, INGOT_CONV=cudnn, `ingot train --steps 10 --json`,
#     NEW2, NEW1, OLD alternating (round 2 if time is left).
#  2. GPU tests of NEW2, INGOT_REQUIRE_GPU=1, three binaries at once (correctness only):
#     test_cuda_channels_last, test_cuda_conv (trainer), test_cuda_kernels (testkit).
#  3. gpt2 bf16 SGD lr 0.01, 20 steps, NEW2 then OLD.
#  4. cuda_profile NEW2 --top 30.
# usage: bash gpu-s36-a-script2.sh beside bins.tgz (new1/, new2/, old/).
START=$(date +%s)
OUT=${OUT:-/tmp/s36-out}; mkdir -p $OUT
LOG=$OUT/gpu-s36-a-call2.txt
exec > $LOG 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-163} - $(date +%s) + START )); }
D=$(cd "$(dirname "$0")" && pwd)
X=/tmp/s36aux; mkdir -p $X
tar xzf $D/bins.tgz -C $X
N2=$X/new2; N1=$X/new1; O=$X/old
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cudnn,os;print(os.path.join(nvidia.cudnn.__path__[0],"lib"))'):$LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u
M=resnet:depth=50,side=224,batch=128
train() { eval B=\$$1; echo "-- train $1 round $2"
  INGOT_CONV=cudnn timeout 40 $B/ingot train --model $M --device cuda --precision bf16 --steps 10 --json > $X/train_$1.json 2> $X/train_$1.err; echo "rc=$?"
  python3 $O/summ.py < $X/train_$1.json || tail -3 $X/train_$1.err; }
echo "== resnet50 224 bf16 b128, cudnn, NEW2/NEW1/OLD alternating"
for B in N2 N1 O; do [ $(left) -gt 40 ] && { train $B 1; t; }; done
echo "== GPU tests NEW2 (three binaries at once)"
P=()
for T in test_cuda_channels_last test_cuda_conv test_cuda_kernels; do
  INGOT_REQUIRE_GPU=1 timeout 60 $N2/$T --test-threads=1 > $X/$T.txt 2>&1 &
  P+=($!)
done
for p in "${P[@]}"; do wait $p; echo "rc=$?"; done
for T in test_cuda_channels_last test_cuda_conv test_cuda_kernels; do
  echo "-- $T"; grep -E "^test |test result|panicked|FAILED|skipping" $X/$T.txt | head -20
done; t
gpt() { eval B=\$$1; echo "-- gpt2 $1"
  timeout 30 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 20 --json > $X/gpt_$1.json 2> $X/gpt_$1.err; echo "rc=$?"
  python3 $O/summ.py < $X/gpt_$1.json || tail -3 $X/gpt_$1.err; }
echo "== gpt2 bf16 SGD, 20 steps"
for B in N2 O; do [ $(left) -gt 30 ] && { gpt $B; t; }; done
echo "== resnet50 round 2"
for B in N2 N1 O; do [ $(left) -gt 38 ] && { train $B 2; t; }; done
echo "== cuda_profile NEW2 --top 30"
[ $(left) -gt 25 ] && INGOT_CONV=cudnn timeout $(( $(left) - 2 )) $N2/cuda_profile $M --precision bf16 --top 30
echo "rc=$?"; t
echo done
