#!/bin/bash
# Session 32, call 1 (H200): where resnet50's 224x224 bf16 step goes (issue 48), and a GPT-2
# over protobuf's 2 GiB imported with external data and trained (issue 46).
# usage: bash docs/results/gpu-s32-call1-script.sh   (binaries in .devbin/bins.tgz)
exec > >(tee -a $OUT/log.txt) 2>&1
set -x
mkdir -p .devbin/x && tar xzf .devbin/bins.tgz -C .devbin/x
B=.devbin/x
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], 'lib'))"):$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
START=$(date +%s)
M=resnet:depth=50,side=224,batch=128
echo "== profile, im2col (default)"
timeout 200 $B/cuda_profile $M --precision bf16 --top 40
echo "== profile, INGOT_CONV=cudnn (t=$(( $(date +%s) - START )) s)"
INGOT_CONV=cudnn timeout 200 $B/cuda_profile $M --precision bf16 --top 25
set +x
echo "== gpt2_large export (t=$(( $(date +%s) - START )) s)"
o=/tmp/s32/gpt2_large; mkdir -p $o
BATCH=2 timeout 400 python3 scripts/onnx_real_models/models.py gpt2_large $o 2>&1 | grep -v -i "warn\|deprecat" | tail -5
ls -la $o | head -20; du -sh $o
X="--loss cross-entropy --class-axis last"
echo "== ingot plan --onnx (t=$(( $(date +%s) - START )) s)"
timeout 200 $B/ingot plan --onnx $o/det.onnx $X --device cuda 2>&1 | tail -6
echo "== ingot train strict f32, torch's weights and batch, 5 steps SGD lr 0.01 (t=$(( $(date +%s) - START )) s)"
timeout 300 $B/ingot train --onnx $o/det.onnx --loss cross-entropy --device cuda --init $o/state_dict.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 5 2>&1 | grep -v "^$" | tail -12
cat $o/torch_losses.json; echo
echo "== ingot train bf16, 10 steps (t=$(( $(date +%s) - START )) s)"
timeout 200 $B/ingot train --onnx $o/det.onnx --loss cross-entropy --device cuda --precision bf16 --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 10 --json 2>&1 | tail -3 | cut -c1-1500
echo "done at t=$(( $(date +%s) - START )) s"
