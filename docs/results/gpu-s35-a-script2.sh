#!/bin/bash
# Session 35, helper A (one H200), call 2, issue 48: the GPU tests of this branch's changes
# (the stem kept NCHW; the max pooling's gradient from its picks) and a second OLD/NEW round.
#  1. test_cuda_channels_last and test_cuda_conv (cnn's two max poolings, f32 and bf16,
#     against the CPU), NEW, INGOT_REQUIRE_GPU=1.
#  2. resnet50 224 bf16 batch 128, INGOT_CONV=cudnn, `ingot train --steps 10 --json`,
#     NEW and OLD alternating, twice.
# usage: bash gpu-s35-a-script2.sh beside bins.tgz (new/ and old/), as call 1's script.
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
for T in test_cuda_channels_last test_cuda_conv; do
  echo "== $T (NEW)"
  INGOT_REQUIRE_GPU=1 timeout 60 $N/$T --test-threads=1 --nocapture > $X/$T.txt 2>&1; echo "rc=$?"
  grep -E -A1 "^test |test result|step [0-9]|panicked|FAILED|skipping" $X/$T.txt | grep -v "^--$" | head -40; t
done
M=resnet:depth=50,side=224,batch=128
export INGOT_CONV=cudnn
train() { eval B=\$$1; echo "-- train $1 round $2"
  timeout 40 $B/ingot train --model $M --device cuda --precision bf16 --steps 10 --json > $X/train_$1.json 2> $X/train_$1.err; echo "rc=$?"
  python3 $O/summ.py < $X/train_$1.json || tail -3 $X/train_$1.err; }
echo "== resnet50 224 bf16 b128, cudnn, NEW/OLD alternating"
for r in 1 2; do
  [ $(left) -gt 30 ] && { train N $r; t; }
  [ $(left) -gt 30 ] && { train O $r; t; }
done
echo done; t
