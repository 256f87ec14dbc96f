#!/bin/bash
# Session 24 device script: every listed model exported (as is, and deterministic), checked,
# trained on CUDA; losses against PyTorch's on the same weights and batch.
# usage: BIN=path/to/ingot bash scripts/onnx_real_models/run.sh   (MODELS="a b" for a subset)
# models.py imports scripts/export_onnx.py (beside it or one folder up).
D=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$D/../ingot}
export PYTHONUNBUFFERED=1
START=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, torchvision, transformers, onnx; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__, 'onnx', onnx.__version__)" 2>&1 | tail -1
for name in ${MODELS:-mobilenet_v3_small unet gpt2 bert efficientnet_b0 convnext_tiny vit_b_16}; do
  if [ $(( $(date +%s) - START )) -gt 400 ]; then echo "== $name: skipped (time)"; continue; fi
  o=/tmp/s24/$name; mkdir -p $o
  echo "================ $name (t=$(( $(date +%s) - START )) s)"
  timeout 150 python3 $D/models.py $name $o 2>&1 | grep -v -i "warn\|record function\|deprecat" | tail -5
  case $name in
    bert) extra="--loss cross-entropy --input-value attention_mask=1 --input-value token_type_ids=0";;
    unet) extra="--loss mse";;
    *) extra="--loss cross-entropy";;
  esac
  if [ -f $o/train.onnx ]; then
    echo "-- ingot onnx check (as exported, training mode: dropout, stochastic depth)"
    $BIN onnx check $o/train.onnx 2>&1 | tail -4
    echo "-- ingot train, as exported (masks drawn), the file's weights, seeded batch, 3 steps"
    timeout 100 $BIN train --onnx $o/train.onnx $extra --device cuda --optimizer sgd --lr 0.01 --steps 3 2>&1 | grep "^step\|^ingot\|rror" | tail -5
  fi
  echo "-- ingot onnx check (deterministic export)"
  $BIN onnx check $o/det.onnx 2>&1 | tail -4
  echo "-- ingot train, deterministic export, --init PyTorch state_dict, PyTorch's batch, 5 steps strict f32, --save"
  timeout 150 $BIN train --onnx $o/det.onnx $extra --device cuda --init $o/state_dict.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 5 --save $o/ingot_saved.safetensors 2>&1 | grep -v "^$" | tail -14
  timeout 60 python3 $D/verify.py $name $o 2>&1 | grep -v -i "warn" | tail -2
done
echo "done at t=$(( $(date +%s) - START )) s"
