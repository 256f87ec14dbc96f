#!/bin/bash
# Session 38, helper A (one H200), call 2, issue 48: NEW = s38-a's final state (column
# reductions several channels a thread reading whole 128-byte lines, blocks up to 1024
# threads where few; channels-last batch-norm kernels with full outputs split by stages from
# 4,096 terms a channel, partial rows of at least 2,048 as before); OLD = main at the
# session's start (/tmp/s38-old).
#  1. resnet50 224 bf16 batch 128, INGOT_CONV=cudnn, `ingot train --steps 10 --json`,
#     NEW and OLD alternating, two rounds.
#  2. gpt2 bf16 SGD lr 0.01, 20 steps, NEW then OLD; resnet18 (CIFAR) bf16, 20 steps.
#  3. cuda_profile NEW, resnet50 224 bf16, --top 40.
#  4. the GPU tests test_cuda_kernels and test_cuda_channels_last (gpu_test_lane, in the
#     background) beside cuda_kernels NEW and OLD on resnet50 side 56 batch 128 bf16
#     channels-last (call 1's one failure, an elementwise kernel's bool, checked on OLD).
# usage: bash .device-bin/a/gpu-s38-a-script2.sh (bins.tar.xz beside it: new/, old/).
X=/tmp/a; source scripts/device_prelude.sh
D=.device-bin/a
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
N=$X/new; O=$X/old; chmod +x $N/* $O/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
M=resnet:depth=50,side=224,batch=128
train() { eval B=\$$1; echo "-- train $1 round $2"
  INGOT_CONV=cudnn timeout $3 $B/ingot train --model $M --device cuda --precision bf16 --steps 10 --json > $X/train_$1.json 2> $X/train_$1.err; echo "rc=$?"
  python3 scripts/summ.py < $X/train_$1.json || tail -3 $X/train_$1.err; }
echo "== resnet50 224 bf16 b128, cudnn, NEW/OLD alternating"
train N 1 60; t; train O 1 40; t
[ $(left 165) -gt 120 ] && { train N 2 25; t; train O 2 25; t; }
run2() { eval B=\$$1; echo "-- $2 $1"
  timeout 25 $B/ingot train --model $2 --device cuda --precision bf16 $3 --steps 20 --json > $X/r_$1.json 2> $X/r_$1.err; echo "rc=$?"
  python3 scripts/summ.py < $X/r_$1.json || tail -3 $X/r_$1.err; }
echo "== gpt2 bf16 SGD lr 0.01, 20 steps"
for B in N O; do [ $(left 165) -gt 100 ] && { run2 $B gpt2 "--optimizer sgd --lr 0.01"; t; }; done
echo "== resnet18 bf16, 20 steps"
for B in N O; do [ $(left 165) -gt 90 ] && { run2 $B resnet18 ""; t; }; done
echo "== cuda_profile NEW --top 40"
[ $(left 165) -gt 75 ] && INGOT_CONV=cudnn timeout 35 $N/cuda_profile $M --precision bf16 --top 40
echo "rc=$?"; t
echo "== GPU tests (background) and cuda_kernels NEW, OLD resnet50 side 56 batch 128"
gpu_test_lane 0 163 $N test_cuda_kernels test_cuda_channels_last & TP=$!
for B in N O; do eval C=\$$B; [ $(left 163) -gt 20 ] && { INGOT_CONV=cudnn INGOT_REQUIRE_GPU=1 timeout $(( $(left 163) / 2 )) $C/cuda_kernels --precision bf16 --channels-last resnet:depth=50,side=56,batch=128 > $X/kernels_$B.txt 2>&1; echo "cuda_kernels $B rc=$?"; grep -E "passed|FAIL" $X/kernels_$B.txt | cut -c1-330 | head -6; t; }; done
wait $TP; cat $X/lane_tests.txt; t
echo done
