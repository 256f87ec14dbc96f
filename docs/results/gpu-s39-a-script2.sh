#!/bin/bash
# Session 39, helper A (one H200), call 2, issue 48: the final state. NEW = s39-a (a convolution
# over fewer than 8 input channels, one group, may grow its workspace to room for cuDNN's
# padded channels-last copies: compiler/src/lower/cuda/conv.rs cudnn_few_channel_room);
# OLD = main at the session's start (/tmp/s39-old).
#  1. resnet50 224 bf16 batch 128, INGOT_CONV=cudnn, `ingot train --steps 10 --json`, NEW and
#     OLD alternating, two rounds; NEW's first run prints its convolutions' choices (INGOT_LOG).
#  2. resnet18 (CIFAR) bf16 20 steps, gpt2 bf16 SGD lr 0.01 20 steps: NEW then OLD.
#  3. GPU tests: NEW's cuda_conv_room (runtime), then cuda_cudnn, cuda_conv, cuda_channels_last.
# usage: bash .device-bin/a/gpu-s39-a-script2.sh (bins.tar.xz beside it: new/, old/).
X=/tmp/a; source scripts/device_prelude.sh
D=.device-bin/a
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
N=$X/new; O=$X/old; chmod +x $N/* $O/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
M=resnet:depth=50,side=224,batch=128
train() { eval B=\$$1; echo "-- train $1 round $2"
  INGOT_CONV=cudnn INGOT_LOG=1 timeout $3 $B/ingot train --model $M --device cuda --precision bf16 --steps 10 --json > $X/train_$1.json 2> $X/train_$1.err; echo "rc=$?"
  python3 scripts/summ.py < $X/train_$1.json || tail -3 $X/train_$1.err; }
stem() { grep "^step: conv" $X/train_$1.err | sed -n '1p;$p'; }
echo "== resnet50 224 bf16 b128, cudnn, NEW/OLD alternating"
train N 1 60; stem N; t; train O 1 40; stem O; t
[ $(left 166) -gt 115 ] && { train N 2 25; t; train O 2 25; t; }
run2() { eval B=\$$1; echo "-- $2 $1"
  timeout 25 $B/ingot train --model $2 --device cuda --precision bf16 $3 --steps 20 --json > $X/r_$1.json 2> $X/r_$1.err; echo "rc=$?"
  python3 scripts/summ.py < $X/r_$1.json || tail -3 $X/r_$1.err; }
echo "== resnet18 bf16, 20 steps"
for B in N O; do [ $(left 166) -gt 90 ] && { run2 $B resnet18 ""; t; }; done
echo "== gpt2 bf16 SGD lr 0.01, 20 steps"
for B in N O; do [ $(left 166) -gt 75 ] && { run2 $B gpt2 "--optimizer sgd --lr 0.01"; t; }; done
echo "== cuda_conv_room (NEW)"
INGOT_REQUIRE_GPU=1 timeout 30 $N/test_cuda_conv_room --test-threads=1 --nocapture 2>&1 | grep -v "^$" | cut -c1-400
t
echo "== GPU tests"
gpu_test_lane 0 166 $N test_cuda_cudnn test_cuda_conv test_cuda_channels_last
cat $X/lane_tests.txt; t
echo done
