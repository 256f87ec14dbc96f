#!/bin/bash
# Session 28, call 2 (one H200): transformers' GPT-2 small (124M, sequence 1024, batch 8) and
# BERT-base (sequence 512, batch 8) exported with PyTorch's SDPA attention, imported with the
# attention recognised as Ingot's fused attention; each beside torch.compile + SDPA (bench.sh),
# then the built-in gpt2 with the same optimizer (SGD, lr 0.01) for the imported-vs-built-in
# step time; then resnet50 imported at batch 3867 (bf16, --budget 80GiB) if time is left.
# usage: bash docs/results/gpu-s28-call2-script.sh   (writes nothing outside /tmp and $OUT)
START=$(date +%s)
NEW=$PWD/.devbin/ingot
S=$PWD/scripts
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { [ $(( $(date +%s) - START )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== 1. GPT-2 small and BERT-base at their real sizes, bf16, beside torch.compile + SDPA"
WORK=/tmp/s28 BUDGET_S=260 MODELS="gpt2_124m bert_base" BIN=$NEW bash $S/onnx_real_models/bench.sh 2>&1 | grep -v "^done"; t
grep -h "attentions fused\|^fusion" /tmp/s28/*/ingot.err 2>/dev/null | head -4
echo "== 2. the built-in gpt2 (vocabulary 50304, head untied), bf16, SGD lr 0.01, 30 steps"
for i in 1 2; do
timeout 100 $NEW train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 30 --json 2>/tmp/g2.err | python3 $S/summ.py || tail -3 /tmp/g2.err
if [ -f /tmp/s28/gpt2_124m/det.onnx ]; then
echo "-- imported GPT-2 again, alternating"
timeout 100 $NEW train --onnx /tmp/s28/gpt2_124m/det.onnx --loss cross-entropy --device cuda --precision bf16 --init /tmp/s28/gpt2_124m/state_dict.safetensors --data /tmp/s28/gpt2_124m/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>/tmp/g2i.err | python3 $S/summ.py || tail -3 /tmp/g2i.err
fi
done; t
if left 330; then
echo "== 3. resnet50 imported at the batch plan --max-batch --budget 80GiB --precision bf16 found (3867)"
python3 -c "
import sys, torch, torchvision
sys.path.insert(0, '$S')
from export_onnx import export
torch.manual_seed(0)
export(torchvision.models.resnet50(num_classes=1000), (torch.randn(2, 3, 224, 224),), '/tmp/r50dyn.onnx', input_names=['input'], dynamic_batch=True)
" 2>&1 | grep -v -i "warn\|deprecat" | tail -2; t
timeout $(( 570 - $(date +%s) + START )) $NEW train --onnx /tmp/r50dyn.onnx --loss cross-entropy --batch 3867 --budget 80GiB --precision bf16 --device cuda --steps 3 --json 2>/tmp/r50big.err | python3 $S/summ.py; echo "exit ${PIPESTATUS[0]}"; tail -5 /tmp/r50big.err
t; fi
echo "done"
