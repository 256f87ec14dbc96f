#!/bin/bash
# Device script (session 26, issue 46): imported models beside what users run.
# 1. resnet50 exported with a symbolic batch: `ingot plan --batch 256 --budget 16GiB` fits it
#    (f32), and a 3-step CUDA run at that batch and budget; then a 3-step bf16 run at the batch
#    `ingot plan --max-batch --budget 80GiB --precision bf16` found (R50_MAX_BATCH, planned on
#    the CPU machine: deterministic), with planned = measured and no out-of-memory.
# 2. Each model (MODELS) exported deterministic at BATCH (CNNs) or 8 (transformers, seq 32):
#    PyTorch's bf16 autocast losses and its torch.compile step and memory (beside_torch.py),
#    then Ingot's bf16 run from the same weights and batch, 30 steps (compare_bf16.py).
# usage: BIN=path/to/ingot bash scripts/onnx_real_models/bench.sh
D=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$D/../ingot}
export PYTHONUNBUFFERED=1
START=$(date +%s)
W=${WORK:-/tmp/s26}
mkdir -p $W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, torchvision, transformers, onnx; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__, 'onnx', onnx.__version__)" 2>&1 | tail -1
if [ -n "${R50_MAX_BATCH:-}" ]; then
  echo "================ resnet50, symbolic batch (t=$(( $(date +%s) - START )) s)"
  python3 -c "
import sys, torch, torchvision
sys.path.insert(0, '$D/..')
from export_onnx import export
torch.manual_seed(0)
export(torchvision.models.resnet50(num_classes=1000), (torch.randn(2, 3, 224, 224),), '$W/resnet50_dyn.onnx', input_names=['input'], dynamic_batch=True)
" 2>&1 | grep -v -i "warn\|deprecat" | tail -3
  R=$W/resnet50_dyn.onnx
  echo "-- ingot plan --batch 256 --budget 16GiB (f32)"
  $BIN plan --onnx $R --loss cross-entropy --batch 256 --budget 16GiB --device cuda 2>&1 | grep "^fitted\|^total\|rror"
  echo "-- ingot train --batch 256 --budget 16GiB, f32 (tf32 off), 3 steps"
  timeout 200 $BIN train --onnx $R --loss cross-entropy --batch 256 --budget 16GiB --device cuda --steps 3 --json 2>&1 | python3 $D/../summ.py
  echo "-- ingot train --batch $R50_MAX_BATCH --budget 80GiB --precision bf16 (the largest batch plan --max-batch finds), 3 steps"
  timeout 300 $BIN train --onnx $R --loss cross-entropy --batch $R50_MAX_BATCH --budget 80GiB --precision bf16 --device cuda --steps 3 --json 2>&1 | python3 $D/../summ.py
fi
for name in ${MODELS:-resnet50 vit_b_16 gpt2 bert resnet18 convnext_tiny efficientnet_b0 mobilenet_v3_small unet}; do
  if [ $(( $(date +%s) - START )) -gt ${BUDGET_S:-480} ]; then echo "== $name: skipped (time)"; continue; fi
  o=$W/$name; mkdir -p $o
  echo "================ $name (t=$(( $(date +%s) - START )) s)"
  case $name in
    bert|bert_base) extra="--loss cross-entropy --input-value attention_mask=1 --input-value token_type_ids=0"; b=8;;
    gpt2|gpt2_124m) extra="--loss cross-entropy"; b=8;;
    unet) extra="--loss mse"; b=${BATCH:-32};;
    *) extra="--loss cross-entropy"; b=${BATCH:-32};;
  esac
  BATCH=$b DET_ONLY=1 timeout 150 python3 $D/models.py $name $o 2>&1 | grep -v -i "warn\|record function\|deprecat" | tail -2
  timeout 200 python3 $D/beside_torch.py $name $o 2>&1 | grep -v -i "warn\|deprecat" | tail -2
  timeout 150 $BIN train --onnx $o/det.onnx $extra --device cuda --precision bf16 --init $o/state_dict.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>$o/ingot.err | python3 $D/compare_bf16.py $name $o || tail -3 $o/ingot.err
done
echo "done at t=$(( $(date +%s) - START )) s"
