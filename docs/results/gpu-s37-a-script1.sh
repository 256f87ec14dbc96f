#!/bin/bash
# Session 37, helper A (one H200), call 1, issue 48: column reductions several channels a
# thread (kernels/src/cuda/fused/colvec.rs) and the batch-norm weight/bias gradients folded
# into the dx kernel (compiler/src/fuse/merge/rules.rs), NEW (s37-a) against OLD (main at the
# session's start, /tmp/s37-old).
#  1. resnet50 224 bf16 batch 128, INGOT_CONV=cudnn, `ingot train --steps 10 --json`,
#     NEW and OLD alternating, two rounds: median step, planned/measured bytes, last loss.
#  2. cuda_kernels NEW: resnet50's fused bf16 kernels checked against the CPU on the GPU (a
#     smaller shape, side 56 batch 16: the same channel counts), then timed.
#  3. cuda_profile NEW, resnet50 224 bf16, --top 40.
# usage: bash .device-bin/a/gpu-s37-a-script1.sh (bins.tgz beside it: new/, old/).
X=/tmp/a; source scripts/device_prelude.sh
D=.device-bin/a
tar xzf $D/bins.tgz -C $X
N=$X/new; O=$X/old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u
M=resnet:depth=50,side=224,batch=128
train() { eval B=\$$1; echo "-- train $1 round $2"
  INGOT_CONV=cudnn timeout 40 $B/ingot train --model $M --device cuda --precision bf16 --steps 10 --json > $X/train_$1.json 2> $X/train_$1.err; echo "rc=$?"
  python3 scripts/summ.py < $X/train_$1.json || tail -3 $X/train_$1.err; }
echo "== resnet50 224 bf16 b128, cudnn, NEW/OLD alternating"
for r in 1 2; do for B in N O; do [ $(left 165) -gt 45 ] && { train $B $r; t; }; done; done
echo "== cuda_kernels NEW resnet50 side 56 batch 16 bf16"
[ $(left 165) -gt 30 ] && INGOT_CONV=cudnn INGOT_REQUIRE_GPU=1 timeout 45 $N/cuda_kernels --precision bf16 --channels-last resnet:depth=50,side=56,batch=16 > $X/kernels.txt 2>&1
echo "rc=$?"; grep -ciE "ok|match" $X/kernels.txt; grep -iE "fail|mismatch|error|panic" $X/kernels.txt | head -10; tail -40 $X/kernels.txt; t
echo "== cuda_profile NEW --top 40"
[ $(left 165) -gt 25 ] && INGOT_CONV=cudnn timeout $(( $(left 165) - 3 )) $N/cuda_profile $M --precision bf16 --top 40
echo "rc=$?"; t
echo done
