#!/bin/bash
# Session 38, helper A (one H200), call 1, issue 48: NEW = s38-a (column reductions several
# channels a thread read whole 128-byte lines: 8 threads across for bf16, blocks up to 1024
# threads where few; channels-last batch-norm kernels with full outputs split by stages from
# 4,096 terms a channel, not 16,384); OLD = main at the session's start (/tmp/s38-old).
#  1. resnet50 224 bf16 batch 128, INGOT_CONV=cudnn, `ingot train --steps 10 --json`,
#     NEW and OLD alternating, two rounds (the first NEW run compiles its kernels).
#  2. resnet18 (CIFAR) bf16, 20 steps, NEW then OLD (its 8x8 batch norms split by stages now).
#  3. cuda_kernels NEW: resnet50's fused bf16 channels-last kernels against the CPU on the
#     GPU at side 56, batch 128 (7x7 and 14x14 stages split as at 224).
#  4. cuda_profile NEW, resnet50 224 bf16, --top 40.
# usage: bash .device-bin/a/gpu-s38-a-script1.sh (bins.tar.xz beside it: new/, old/).
X=/tmp/a; source scripts/device_prelude.sh
D=.device-bin/a
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
N=$X/new; O=$X/old; chmod +x $N/* $O/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u
M=resnet:depth=50,side=224,batch=128
train() { eval B=\$$1; echo "-- train $1 round $2"
  INGOT_CONV=cudnn timeout $3 $B/ingot train --model $M --device cuda --precision bf16 --steps 10 --json > $X/train_$1.json 2> $X/train_$1.err; echo "rc=$?"
  python3 scripts/summ.py < $X/train_$1.json || tail -3 $X/train_$1.err; }
echo "== resnet50 224 bf16 b128, cudnn, NEW/OLD alternating"
train N 1 70; t; train O 1 40; t
[ $(left 165) -gt 60 ] && { train N 2 25; t; train O 2 25; t; }
r18() { eval B=\$$1; echo "-- resnet18 $1"
  timeout 25 $B/ingot train --model resnet18 --device cuda --precision bf16 --steps 20 --json > $X/r18_$1.json 2> $X/r18_$1.err; echo "rc=$?"
  python3 scripts/summ.py < $X/r18_$1.json || tail -3 $X/r18_$1.err; }
echo "== resnet18 bf16, 20 steps"
for B in N O; do [ $(left 165) -gt 70 ] && { r18 $B; t; }; done
echo "== cuda_kernels NEW resnet50 side 56 batch 128 bf16 channels-last"
[ $(left 165) -gt 60 ] && INGOT_CONV=cudnn INGOT_REQUIRE_GPU=1 timeout 40 $N/cuda_kernels --precision bf16 --channels-last resnet:depth=50,side=56,batch=128 > $X/kernels.txt 2>&1
echo "rc=$?"; grep -E "passed|FAIL" $X/kernels.txt | head -12; t
echo "== cuda_profile NEW --top 40"
[ $(left 165) -gt 25 ] && INGOT_CONV=cudnn timeout $(( $(left 165) - 3 )) $N/cuda_profile $M --precision bf16 --top 40
echo "rc=$?"; t
echo done
