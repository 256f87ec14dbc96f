#!/bin/bash
# Session 40, the lead's last call (one H200): resnet50 exported with a symbolic batch, 3 bf16
# steps at batch 5,661 under --budget 80GiB (the largest batch `plan --max-batch` finds once
# convolutions over tensors too large for cuDNN stay NCHW), whole output kept.
X=/tmp/s40m; . scripts/device_prelude.sh
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .device-bin/lead/last2.txz $X
python3 -c "
import sys, torch, torchvision
sys.path.insert(0, 'scripts')
from export_onnx import export
torch.manual_seed(0)
export(torchvision.models.resnet50(num_classes=1000), (torch.randn(2, 3, 224, 224),), '$X/r50dyn.onnx', input_names=['input'], dynamic_batch=True)
" > /dev/null 2>&1; t
timeout $(( $(left 270) - 5 )) $X/new/ingot train --onnx $X/r50dyn.onnx --loss cross-entropy --batch ${B:-5661} --budget 80GiB --precision bf16 --device cuda --steps 3 --json > $X/big.txt 2>&1
echo "rc=$?"; grep -v '"fitted"' $X/big.txt | tail -12 | cut -c1-600; python3 scripts/summ.py < $X/big.txt; t
