#!/bin/bash
# Session 28 (call 1)'s device call (one H200): grouped convolutions batched over their groups.
# NEW = main with the change (.devbin/ingot), OLD = main before it (.devbin/ingot_old);
# CUDA_TEST = the cuda integration-test binary built from NEW's tree.
# usage: bash docs/results/gpu-s27-script.sh   (writes nothing outside /tmp and $OUT)
START=$(date +%s)
NEW=$PWD/.devbin/ingot
OLD=$PWD/.devbin/ingot_old
S=$PWD/scripts
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { [ $(( $(date +%s) - START )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== 1. the grouped-convolution GPU test (INGOT_REQUIRE_GPU=1) and the other GPU-vs-CPU tests"
INGOT_REQUIRE_GPU=1 timeout 200 .devbin/cuda_test --test-threads=1 --nocapture grouped_convolutions on_the_gpu_mlp 2>&1 | grep -E "step|parameters|test |result|panicked" | tail -12; t
echo "== 2. imported CNNs with depthwise convolutions, batch 32, bf16: NEW beside PyTorch (bench.sh)"
WORK=/tmp/s28 BUDGET_S=330 MODELS="efficientnet_b0 mobilenet_v3_small convnext_tiny" BIN=$NEW bash $S/onnx_real_models/bench.sh 2>&1 | grep -v "^done"; t
if left 380; then
echo "== 3. mobilenet_v3_small with OLD (the per-group GEMMs), same weights and batch"
timeout 100 $OLD train --onnx /tmp/s28/mobilenet_v3_small/det.onnx --loss cross-entropy --device cuda --precision bf16 --init /tmp/s28/mobilenet_v3_small/state_dict.safetensors --data /tmp/s28/mobilenet_v3_small/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>/tmp/mn-old.err | python3 $S/summ.py || tail -3 /tmp/mn-old.err
t; fi
if left 420; then
echo "== 4. resnet50 imported at the batch plan --max-batch --budget 80GiB --precision bf16 found (3867), stderr kept"
python3 -c "
import sys, torch, torchvision
sys.path.insert(0, '$S')
from export_onnx import export
torch.manual_seed(0)
export(torchvision.models.resnet50(num_classes=1000), (torch.randn(2, 3, 224, 224),), '/tmp/r50dyn.onnx', input_names=['input'], dynamic_batch=True)
" 2>&1 | grep -v -i "warn\|deprecat" | tail -2
timeout 100 $NEW train --onnx /tmp/r50dyn.onnx --loss cross-entropy --batch 3867 --budget 80GiB --precision bf16 --device cuda --steps 3 --json 2>/tmp/r50big.err | python3 $S/summ.py; tail -5 /tmp/r50big.err
t; fi
echo "done"
