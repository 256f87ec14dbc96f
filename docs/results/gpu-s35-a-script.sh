#!/bin/bash
# Session 35, helper A (one H200), issue 48: resnet50 at 224 channels-last.
#  1. test_cuda_channels_last (NEW), INGOT_REQUIRE_GPU=1.
#  2. resnet50 224 bf16 batch 128, INGOT_CONV=cudnn: cuda_profile (--top 40) and
#     `ingot train --steps 10 --json`, NEW (this branch: the stem kept NCHW, the max pooling's
#     gradient from its windows' picks) and OLD (main's build, /tmp/s35-old) alternating.
# usage: bash gpu-s35-a-script.sh beside bins.tgz (new/ and old/): the device call runs the
# lead's checkout, so this script and the binaries travel in its ignored .device-bin/a/.
START=$(date +%s)
OUT=${OUT:-/tmp/s35-out}; mkdir -p $OUT
X=/tmp/s35aux; mkdir -p $X
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-190} - $(date +%s) + START )); }
D=$(cd "$(dirname "$0")" && pwd)
tar xzf $D/bins.tgz -C $X
N=$X/new; O=$X/old
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cudnn,os;print(os.path.join(nvidia.cudnn.__path__[0],"lib"))'):$LD_LIBRARY_PATH
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
echo "== 1. test_cuda_channels_last (NEW)"
INGOT_REQUIRE_GPU=1 timeout 50 $N/test_cuda_channels_last --test-threads=1 --nocapture > $X/test.txt 2>&1; echo "rc=$?"
grep -E "^test |test result|step [0-9]|panicked|FAILED|skipping" $X/test.txt | head -30; t
M=resnet:depth=50,side=224,batch=128
export INGOT_CONV=cudnn
prof() { eval B=\$$1; echo "-- profile $1"
  timeout 50 $B/cuda_profile $M --precision bf16 --top 40 > $X/prof_$1.txt 2>&1; echo "rc=$?"
  sed -n 1,46p $X/prof_$1.txt; grep -iE "error|panick" $X/prof_$1.txt | head -3; }
train() { eval B=\$$1; echo "-- train $1"
  timeout 40 $B/ingot train --model $M --device cuda --precision bf16 --steps 10 --json > $X/train_$1.json 2> $X/train_$1.err; echo "rc=$?"
  python3 $O/summ.py < $X/train_$1.json || tail -3 $X/train_$1.err; }
echo "== 2. resnet50 224 bf16 b128, cudnn, NEW/OLD alternating"
prof N; t
[ $(left) -gt 50 ] && { prof O; t; }
[ $(left) -gt 40 ] && { train N; t; }
[ $(left) -gt 40 ] && { train O; t; }
echo done; t
