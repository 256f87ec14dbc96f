#!/bin/bash
# Session 29, call 1 (one H200): where the imported GPT-2's step goes beside the built-in gpt2's
# (both compiled to step executables with SGD lr 0.01, bf16, and profiled op by op by
# cuda_profile), then convnext_tiny and vit_b_16 imported beside PyTorch (bench.sh).
# BIN = main at the session's start (.devbin/ingot), PROF = trainer/examples/cuda_profile.
# usage: bash docs/results/gpu-s29-call1-script.sh   (writes nothing outside /tmp and $OUT)
START=$(date +%s)
BIN=$PWD/.devbin/ingot
PROF=$PWD/.devbin/cuda_profile
S=$PWD/scripts
R=$S/onnx_real_models
OUT=${OUT:-/tmp/s29-out}; mkdir -p $OUT
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { [ $(( $(date +%s) - START )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== 1. GPT-2 small imported (transformers $(python3 -c 'import transformers; print(transformers.__version__)')) and built-in, compiled with SGD, bf16"
o=/tmp/s29/gpt2_124m; mkdir -p $o
DET_ONLY=1 timeout 120 python3 $R/models.py gpt2_124m $o 2>&1 | grep -v -i "warn\|record function\|deprecat" | tail -1; t
timeout 120 $BIN compile --onnx $o/det.onnx --loss cross-entropy --device cuda --precision bf16 --optimizer sgd --lr 0.01 -o /tmp/s29/imported.exe 2>&1 | tail -1
timeout 120 $BIN compile --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 -o /tmp/s29/builtin.exe 2>&1 | tail -1
t
for e in builtin imported; do
  echo "== profile: $e"
  timeout 150 $PROF /tmp/s29/$e.exe --top 40 > $OUT/profile-$e.txt 2>&1; echo "exit $?"
  head -60 $OUT/profile-$e.txt; t
done
if left 330; then
echo "== 2. convnext_tiny and vit_b_16 imported, bf16, beside PyTorch (bench.sh)"
WORK=/tmp/s29b BUDGET_S=$(( 500 - $(date +%s) + START )) MODELS="convnext_tiny vit_b_16" BIN=$BIN bash $R/bench.sh 2>&1 | grep -v "^done"; t
fi
echo "done"
