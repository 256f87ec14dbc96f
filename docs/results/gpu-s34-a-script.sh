#!/bin/bash
# Session 34, helper A (one H200): channels-last convolutions (issue 48).
#  1. test_cuda_channels_last (resnet18 at 32x32 NHWC through cuDNN against the CPU's NCHW
#     step, f32 and bf16; plan = allocation, nothing allocated over 50 steps), INGOT_REQUIRE_GPU=1.
#  2. resnet50 224 bf16 batch 128, INGOT_CONV=cudnn: cuda_profile and `ingot train --steps 10`,
#     OLD (main's build) and NEW (this branch: channels-last under INGOT_CONV=cudnn) alternating.
# usage: bash gpu-s34-a-script.sh, beside bins.tgz (new/ and old/): the device call runs the
# lead's checkout, so this script and the binaries travelled in its ignored .device-bin/s34a/.
START=$(date +%s)
OUT=${OUT:-/tmp/s34-out}; mkdir -p $OUT
X=/tmp/s34aux; mkdir -p $X
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-232} - $(date +%s) + START )); }
D=$(cd "$(dirname "$0")" && pwd)
tar xzf $D/bins.tgz -C $D
N=$D/new; O=$D/old
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], 'lib'))"):$LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
echo "== 1. test_cuda_channels_last (NEW)"
INGOT_REQUIRE_GPU=1 timeout 90 $N/test_cuda_channels_last --test-threads=1 --nocapture > $X/test.txt 2>&1; echo "rc=$?"
grep -E "^test |test result|step [0-9]|panicked|FAILED|skipping" $X/test.txt | head -30; t
M=resnet:depth=50,side=224,batch=128
export INGOT_CONV=cudnn
prof() { eval B=\$$1; echo "-- profile $1 round $2"
  timeout 60 $B/cuda_profile $M --precision bf16 --top 10 > $X/prof_$1_$2.txt 2>&1; echo "rc=$?"
  head -4 $X/prof_$1_$2.txt; [ $2 = 1 ] && sed -n 5,18p $X/prof_$1_$2.txt; grep -iE "error|panick" $X/prof_$1_$2.txt | head -3; }
train() { eval B=\$$1; echo "-- train $1"
  timeout 60 $B/ingot train --model $M --device cuda --precision bf16 --steps 10 --json > $X/train_$1.json 2> $X/train_$1.err; echo "rc=$?"
  python3 $N/summ.py < $X/train_$1.json || tail -3 $X/train_$1.err; }
echo "== 2. resnet50 224 bf16 b128, cudnn, OLD/NEW alternating"
prof N 1; t; prof O 1; t
[ $(left) -gt 55 ] && { train N; t; }
[ $(left) -gt 55 ] && { train O; t; }
[ $(left) -gt 45 ] && { prof N 2; t; }
[ $(left) -gt 45 ] && { prof O 2; t; }
echo done; t
