#!/bin/bash
# Session 31, call 2 (one H200), NEW = main at 031e61d (.devbin/ingot, the binary of call 1's a62a2de
# with only benchmarks and tests added since).
#  1. issue 49's table on all 16 host cores: scripts/cpu_bench.py --threads 16, default steps
#     (Ingot beside PyTorch eager and torch.compile, f32, mlp, cnn, gpt-mini).
#  2. issue 46: resnet50 imported with a symbolic batch, at the batch `plan --max-batch --budget
#     80GiB --precision bf16` finds (3,867), 3 bf16 steps: planned = measured, no out-of-memory.
# usage: bash docs/results/gpu-s31-call2-script.sh
START=$(date +%s)
NEW=$PWD/.devbin/ingot
S=$PWD/scripts
OUT=${OUT:-/tmp/s31-out}; mkdir -p $OUT
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
echo "== 1. CPU, 16 threads: Ingot beside PyTorch"
timeout 330 python3 $S/cpu_bench.py --bin $NEW --threads 16 --models mlp cnn gpt-mini --md $OUT/cpu16.md --json $OUT/cpu16.json 2>&1 | tail -12
cat $OUT/cpu16.md; t
echo "== 2. resnet50 imported at batch 3867, bf16, --budget 80GiB"
python3 -c "
import sys, torch, torchvision
sys.path.insert(0, '$S')
from export_onnx import export
torch.manual_seed(0)
export(torchvision.models.resnet50(num_classes=1000), (torch.randn(2, 3, 224, 224),), '/tmp/r50dyn.onnx', input_names=['input'], dynamic_batch=True)
" 2>&1 | grep -v -i "warn\|deprecat" | tail -2; t
timeout $(( 575 - $(date +%s) + START )) $NEW train --onnx /tmp/r50dyn.onnx --loss cross-entropy --batch 3867 --budget 80GiB --precision bf16 --device cuda --steps 3 --json 2>$OUT/r50big.err | python3 $S/summ.py; echo "exit ${PIPESTATUS[0]}"; tail -5 $OUT/r50big.err
t; echo done
