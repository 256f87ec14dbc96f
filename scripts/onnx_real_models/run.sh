#!/bin/bash
# Device script (sessions 24, 25): every listed model exported (as is, and deterministic), checked
# (`ingot onnx check` runs the whole import, with the same flags as train), trained on CUDA;
# losses against PyTorch's on the same weights and batch; the --save file loaded back with
# PyTorch's strict load_state_dict (verify.py).
# Session 25 exercises: gpt2's tied lm_head.weight (its state_dict with both names: --init
# takes the alias, --save writes it; and safetensors' save_model file, one name and metadata);
# bert's token labels against a [batch, seq, vocab] logits output (the class axis read off
# --data's y; --class-axis last where there is no batch file); vit_b_16's packed attention.
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
  o=/tmp/s25/$name; mkdir -p $o
  echo "================ $name (t=$(( $(date +%s) - START )) s)"
  timeout 150 python3 $D/models.py $name $o 2>&1 | grep -v -i "warn\|record function\|deprecat" | tail -5
  # axis: for token models without a batch file (the check, the as-exported run), the class
  # axis of [batch, seq, vocab] logits; with --data it is read off y's shape [batch, seq].
  axis=""
  case $name in
    bert) extra="--loss cross-entropy --input-value attention_mask=1 --input-value token_type_ids=0"; axis="--class-axis last";;
    gpt2) extra="--loss cross-entropy"; axis="--class-axis last";;
    unet) extra="--loss mse";;
    *) extra="--loss cross-entropy";;
  esac
  if [ -f $o/train.onnx ]; then
    echo "-- ingot onnx check (as exported, training mode: dropout, stochastic depth)"
    $BIN onnx check $o/train.onnx $extra $axis 2>&1 | tail -4
    echo "-- ingot train, as exported (masks drawn), the file's weights, seeded batch, 3 steps"
    timeout 100 $BIN train --onnx $o/train.onnx $extra $axis --device cuda --optimizer sgd --lr 0.01 --steps 3 2>&1 | grep "^step\|^ingot\|rror" | tail -5
  fi
  echo "-- ingot onnx check (deterministic export)"
  $BIN onnx check $o/det.onnx $extra $axis 2>&1 | tail -4
  echo "-- ingot train, deterministic export, --init PyTorch state_dict, PyTorch's batch, 5 steps strict f32, --save"
  timeout 150 $BIN train --onnx $o/det.onnx $extra --device cuda --init $o/state_dict.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 5 --save $o/ingot_saved.safetensors 2>&1 | grep -v "^$" | tail -14
  timeout 60 python3 $D/verify.py $name $o 2>&1 | grep -v -i "warn" | tail -2
  if [ $name = gpt2 ]; then
    echo "-- gpt2: --init from safetensors' save_model file (lm_head.weight only, wte named in its metadata), 5 steps, --save"
    timeout 150 $BIN train --onnx $o/det.onnx $extra --device cuda --init $o/state_dict_save_model.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 5 --save $o/ingot_saved_meta.safetensors 2>&1 | grep "^step\|^ingot\|tied\|rror" | tail -8
    timeout 60 python3 $D/verify.py $name $o ingot_saved_meta.safetensors 2>&1 | grep -v -i "warn" | tail -2
  fi
done
echo "done at t=$(( $(date +%s) - START )) s"
