#!/bin/bash
# Session 28, call 3 (one H200): the merged tree. NEW = main after the session's merges
# (.devbin/ingot), OLD = main at the attention-recognition commit, before the helpers' merges
# (.devbin/ingot_s28a); CUDA_TEST = the cuda integration tests built from NEW's tree.
# usage: bash docs/results/gpu-s28-call3-script.sh   (writes nothing outside /tmp and $OUT)
START=$(date +%s)
NEW=$PWD/.devbin/ingot
OLD=$PWD/.devbin/ingot_s28a
S=$PWD/scripts
R=$S/onnx_real_models
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { [ $(( $(date +%s) - START )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== 1. the GPU tests of the merged tree (INGOT_REQUIRE_GPU=1)"
INGOT_REQUIRE_GPU=1 timeout 150 .devbin/cuda_test --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tail -30; t
echo "== 2. gpt2 bf16 (AdamW), OLD and NEW alternating (NEW counts non-finite parameters in the update kernels)"
for i in 1 2; do for b in $OLD $NEW; do
  echo -n "$(basename $b): "; timeout 60 $b train --model gpt2 --device cuda --precision bf16 --steps 30 --json 2>/dev/null | python3 $S/summ.py
done; done; t
echo "== 3. a step whose update makes the weights infinite stops at once (NEW)"
timeout 60 $NEW train --model mlp --device cuda --steps 3 --lr 1e39 2>&1 | tail -2; echo "exit ${PIPESTATUS[0]}"; t
echo "== 4. U-Net and efficientnet_b0 (batch 32, bf16): convolution workspace by the room below the peak, masks recomputed; OLD and NEW"
for name in unet efficientnet_b0; do
  o=/tmp/s28c/$name; mkdir -p $o
  case $name in unet) extra="--loss mse";; *) extra="--loss cross-entropy";; esac
  BATCH=32 DET_ONLY=1 timeout 120 python3 $R/models.py $name $o 2>&1 | grep -v -i "warn\|record function\|deprecat" | tail -1
  for b in $OLD $NEW; do
    echo -n "$name $(basename $b): "
    timeout 100 $b train --onnx $o/det.onnx $extra --device cuda --precision bf16 --init $o/state_dict.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>$o/err.txt | python3 -c "
import sys; sys.path.insert(0, '$S')
from summ import read_run
l, s = read_run(sys.stdin)
print('no summary' if s is None else 'step_ms %.3f planned %.1f MiB measured %.1f MiB losses %s' % (s['median_step_seconds']*1e3, s['planned_bytes']/2**20, (s.get('measured_bytes') or 0)/2**20, [round(v, 5) for v in l[:5]]))" || tail -2 $o/err.txt
  done
done; t
if left 400; then
echo "== 5. GPT-2 small (124M) from transformers 5.17 (its causal mask built once), NEW, beside the built-in gpt2 (SGD lr 0.01, bf16)"
o=/tmp/s28c/gpt2_124m; mkdir -p $o
DET_ONLY=1 timeout 120 python3 $R/models.py gpt2_124m $o 2>&1 | grep -v -i "warn\|record function\|deprecat" | tail -1
for i in 1 2; do
  echo -n "imported: "; timeout 100 $NEW train --onnx $o/det.onnx --loss cross-entropy --device cuda --precision bf16 --init $o/state_dict.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>$o/err.txt | python3 $S/summ.py || tail -2 $o/err.txt
  echo -n "built-in: "; timeout 100 $NEW train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 30 --json 2>/dev/null | python3 $S/summ.py
done; t; fi
if left 430; then
echo "== 6. resnet50 imported, batch 3867, bf16, --budget 80GiB (the plan fits without recomputation now: 79.34 GiB), 3 steps"
python3 -c "
import sys, torch, torchvision
sys.path.insert(0, '$S')
from export_onnx import export
torch.manual_seed(0)
export(torchvision.models.resnet50(num_classes=1000), (torch.randn(2, 3, 224, 224),), '/tmp/r50dyn.onnx', input_names=['input'], dynamic_batch=True)
" 2>&1 | grep -v -i "warn\|deprecat" | tail -2; t
timeout $(( 540 - $(date +%s) + START )) $NEW train --onnx /tmp/r50dyn.onnx --loss cross-entropy --batch 3867 --budget 80GiB --precision bf16 --device cuda --steps 3 --json 2>/tmp/r50big.err | python3 $S/summ.py; echo "exit ${PIPESTATUS[0]}"; tail -4 /tmp/r50big.err
t; fi
echo "done"
