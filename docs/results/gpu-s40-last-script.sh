#!/bin/bash
# Session 40, the lead's last call (two H200s): GPU 0: resnet50 exported with a symbolic batch,
# 3 bf16 steps at batch 5411 under --budget 80GiB (the largest batch `plan --max-batch` finds),
# its whole output kept (part 2's run gave no summary). GPU 1: the imported resnet50 at batch
# 32 from bench.sh's export, OLD's 30 bf16 steps then NEW's, each against PyTorch's losses
# (is the wider gap to torch bf16 in part 1 the stem's route?).
X=/tmp/s40l; . scripts/device_prelude.sh
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .device-bin/lead/final.txz $X
N=$X/new; O=$X/old; D=scripts/onnx_real_models
( export CUDA_VISIBLE_DEVICES=0
  python3 -c "
import sys, torch, torchvision
sys.path.insert(0, 'scripts')
from export_onnx import export
torch.manual_seed(0)
export(torchvision.models.resnet50(num_classes=1000), (torch.randn(2, 3, 224, 224),), '$X/r50dyn.onnx', input_names=['input'], dynamic_batch=True)
" > /dev/null 2>&1
  timeout $(( $(left 280) - 5 )) $N/ingot train --onnx $X/r50dyn.onnx --loss cross-entropy --batch 5411 --budget 80GiB --precision bf16 --device cuda --steps 3 --json > $X/big.txt 2>&1
  echo "rc=$?" >> $X/big.txt ) & P0=$!
export CUDA_VISIBLE_DEVICES=1
o=$X/r50; mkdir -p $o
BATCH=32 DET_ONLY=1 timeout 150 python3 $D/models.py resnet50 $o 2>&1 | tail -1
timeout 200 python3 $D/beside_torch.py resnet50 $o 2>&1 | grep -v -i 'warn\|deprecat' | tail -2
for b in O N; do eval B=\$$b
  echo -n "$b: "; timeout 80 $B/ingot train --onnx $o/det.onnx --loss cross-entropy --device cuda --precision bf16 --init $o/state_dict.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>$o/err.txt | python3 $D/compare_bf16.py resnet50 $o || tail -3 $o/err.txt
done; t
wait $P0; echo "== batch 5411 (GPU 0)"; grep -v '"step"' $X/big.txt | tail -25; grep -c '"loss"' $X/big.txt; t
