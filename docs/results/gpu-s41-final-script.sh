#!/bin/bash
# Session 41, the lead's final call on two H200s: the merged tree (NEW: main with branches
# s41-a, -b, -d, -e, -f and the lead's duplicates commit) against main at the session's start
# (OLD, 4b90a85).
# GPU 0: gpt2 bf16 (issue 47's unchanged-gpt2 check; F's cross-entropy exponentials), resnet50
#   224 b128 bf16 (A's pooling gradient), resnet18 and cnn (CIFAR) bf16, OLD and NEW
#   alternating, two rounds each, median step, planned and measured bytes, last loss.
# GPU 1: the GPU test binaries of what changed, INGOT_REQUIRE_GPU=1, one at a time.
# usage: END=430 bash docs/results/gpu-s41-final-script.sh  (.device-bin/lead/final.txz)
X=/tmp/s41f; . scripts/device_prelude.sh
END=${END:-430}
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .device-bin/lead/final.txz $X
N=$X/new; O=$X/old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
gpu_test_lane 1 $END $N cuda_bf16_testkit cuda_kernels cuda_conv cuda_channels_last cuda_bf16_kernels cuda_sums & P1=$!
export CUDA_VISIBLE_DEVICES=0
run() { # label, timeout, binary, args...: one summary line
  local l=$1 s=$2 b=$3; shift 3
  echo -n "$l: "; timeout $s $b "$@" 2>$X/run.err | python3 scripts/summ.py || tail -3 $X/run.err
}
echo "== gpt2 bf16 SGD lr 0.01, 20 steps"
for b in O N O N; do eval B=\$$b
  run "gpt2 $b" 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 20 --json
done; t
echo "== resnet50 224 b128 bf16, 10 steps"
for b in O N O N; do eval B=\$$b
  run "resnet50 $b" 60 $B/ingot train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json
done; t
echo "== resnet18 (CIFAR) and cnn bf16, 30 steps"
for m in resnet18 cnn; do for b in O N O N; do eval B=\$$b
  run "$m $b" 30 $B/ingot train --model $m --device cuda --precision bf16 --steps 30 --json
done; done; t
wait $P1; echo "== GPU tests (GPU 1)"; cat $X/lane_tests.txt; t
echo done
