#!/bin/bash
# Session 40, the lead's final calls on two H200s: the merged tree (NEW) against main at the
# session's start (OLD, 2219ce8).
# PART=1: issue 46's table, every model at its real size (torchvision's resnet50, vit_b_16,
#   resnet18, convnext_tiny, efficientnet_b0, mobilenet_v3_small at 224x224 batch 32;
#   transformers' GPT-2 small and BERT base at batch 8; the U-Net at batch 32), exported,
#   PyTorch's bf16 autocast losses and torch.compile's step and peak beside 30 Ingot bf16 steps
#   from the same weights and batch (scripts/onnx_real_models/bench.sh), in two lanes, one a GPU.
# PART=2 (the warm machine, right after): GPU 0: resnet50 exported with a symbolic batch, fitted
#   to 16 GiB at batch 256 (f32) and trained 3 steps, then trained 3 bf16 steps at the largest
#   batch `plan --max-batch --budget 80GiB` finds (R50_MAX_BATCH, planned on the 2-core machine:
#   deterministic). GPU 1: gpt2 bf16 and resnet50 224 b128 bf16 (built-in), OLD and NEW
#   alternating (issue 47's unchanged-gpt2 check; issue 48's default route), resnet18 and cnn
#   (the channels-last workspaces' new floor, issue 46), the FLOP rate line (issue 52).
# usage: PART=1 END=580 bash docs/results/gpu-s40-final-script.sh  (.device-bin/lead/final.txz)
X=/tmp/s40f; . scripts/device_prelude.sh
PART=${PART:-1}; END=${END:-580}
if [ ! -x $X/new/ingot ]; then
  python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .device-bin/lead/final.txz $X
fi
N=$X/new; O=$X/old
echo "part $PART"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
run() { # label, timeout, binary, args...: one summary line
  local l=$1 s=$2 b=$3; shift 3
  echo -n "$l: "; timeout $s $b "$@" 2>$X/run.err | python3 scripts/summ.py || tail -3 $X/run.err
}
if [ $PART = 1 ]; then
  lane() { # gpu, models
    CUDA_VISIBLE_DEVICES=$1 MODELS="$2" BUDGET_S=$(( $(left $END) - 170 )) WORK=$X/b$1 BIN=$N/ingot \
      bash scripts/onnx_real_models/bench.sh > $OUT/table-gpu$1.txt 2>&1
  }
  lane 0 "resnet50 gpt2_124m vit_b_16 bert_base" & P0=$!
  lane 1 "unet resnet18 mobilenet_v3_small efficientnet_b0 convnext_tiny" & P1=$!
  wait $P0; wait $P1
  echo "== table"; grep -h " batch [0-9]*: \|skipped\|rror" $OUT/table-gpu*.txt; t
  for j in $X/b*/*/torch_bf16.json; do m=$(basename $(dirname $j)); cp $j $OUT/torch-$m.json; done
else
  ( export CUDA_VISIBLE_DEVICES=0; MODELS=" " R50_MAX_BATCH=${R50_MAX_BATCH:?} WORK=$X/r50 BIN=$N/ingot \
      bash scripts/onnx_real_models/bench.sh > $OUT/r50-budget.txt 2>&1 ) & P0=$!
  export CUDA_VISIBLE_DEVICES=1
  echo "== gpt2 bf16 SGD lr 0.01, 20 steps, OLD/NEW alternating"
  for b in O N; do eval B=\$$b
    run $b 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 20 --json
  done; t
  echo "== resnet50 224 b128 bf16, 10 steps, OLD/NEW alternating"
  for b in O N; do eval B=\$$b
    run $b 60 $B/ingot train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json
  done; t
  echo "== resnet18 (CIFAR) and cnn bf16, 30 steps, OLD/NEW alternating"
  for m in resnet18 cnn; do for b in O N O N; do eval B=\$$b
    run "$m $b" 30 $B/ingot train --model $m --device cuda --precision bf16 --steps 30 --json
  done; done; t
  echo "== the progress line (NEW, gpt2 bf16, 20 steps)"
  timeout 45 $N/ingot train --model gpt2 --device cuda --precision bf16 --steps 20 2>&1 | tail -4; t
  wait $P0; echo "== resnet50, symbolic batch (GPU 0)"; cat $OUT/r50-budget.txt; t
fi
echo done
