#!/bin/bash
# Session 43, the lead's final call on one H200: the merged tree (NEW: main with this session's
# branches) against main at the session's start (OLD, 1f4c5a2).
# 1. resnet50 224 b128 bf16 OLD and NEW alternating, two rounds, with torchvision under
#    torch.compile (channels_last, bf16 autocast, cudnn.benchmark; scripts/resnet_beside_torch.py)
#    between the rounds, so that issue 48's ratio is of one call; then gpt2 and resnet18 bf16
#    alternating: median step, planned and measured bytes, last loss.
# 2. (after them) resnet50 fitted to P = 2,916,900,864 B (PyTorch's peak with every block checkpointed;
#    issue 51): the executables each binary compiled here, `ingot run`, alternated.
# 3. The GPU tests of what changed, INGOT_REQUIRE_GPU=1, one at a time.
# usage: END=530 bash docs/results/gpu-s43-final-script.sh  (.device-bin/lead/final.txz)
X=/tmp/s43f; . scripts/device_prelude.sh
END=${END:-530}
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .device-bin/lead/final.txz $X
N=$X/new; O=$X/old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
run() { # label, timeout, binary, args...: one summary line
  local l=$1 s=$2 b=$3; shift 3
  echo -n "$l: "; timeout $s $b "$@" 2>$X/run.err | python3 scripts/summ.py || tail -3 $X/run.err
}
echo "== resnet50 224 b128 bf16, 10 steps; torch.compile channels_last between the rounds"
R50="--model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json"
run "resnet50 O" 60 $O/ingot train $R50
run "resnet50 N" 60 $N/ingot train $R50
timeout 150 python3 scripts/resnet_beside_torch.py --depth 50 --side 224 --batch 128 --precision bf16 2>&1 | tail -2
run "resnet50 O" 60 $O/ingot train $R50
run "resnet50 N" 60 $N/ingot train $R50
t
echo "== gpt2 bf16 SGD lr 0.01, 20 steps"
for b in O N O N; do eval B=\$$b
  run "gpt2 $b" 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 20 --json
done; t
echo "== resnet18 (CIFAR) bf16, 30 steps"
for m in resnet18; do for b in O N O N; do eval B=\$$b
  run "$m $b" 30 $B/ingot train --model $m --device cuda --precision bf16 --steps 30 --json
done; done; t
echo "== resnet50 fitted to P = 2916900864 B, ingot run, 10 steps"
for b in O N; do eval B=\$$b
  run "resnet50@P $b" 60 $B/ingot run $B/r50p.ingot --device cuda --steps 10 --json
done; t
echo "== GPU tests"
gpu_test_lane 0 $((END-10)) $N cuda_depthwise cuda_channels_last cuda_epilogue cuda_conv_room cuda_cudnn cuda_conv
cat $X/lane_tests.txt; t; echo done
