#!/bin/bash
# Session 29, call 2 (one H200): the imported GPT-2's op-by-op profile (call 1's compile needed
# --class-axis last), then session 28's larger-GPT script (gpt2-medium and the 1.3B GPT beside
# torch.compile + SDPA, bf16) within what is left.
# usage: bash docs/results/gpu-s29-call2-script.sh   (writes nothing outside /tmp and $OUT)
START=$(date +%s)
BIN=$PWD/.devbin/ingot
PROF=$PWD/.devbin/cuda_profile
R=$PWD/scripts/onnx_real_models
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== 1. GPT-2 small imported, compiled with SGD lr 0.01, bf16, profiled op by op"
o=/tmp/s29/gpt2_124m; mkdir -p $o
DET_ONLY=1 timeout 120 python3 $R/models.py gpt2_124m $o 2>&1 | grep -v -i "warn\|record function\|deprecat" | tail -1; t
timeout 120 $BIN compile --onnx $o/det.onnx --loss cross-entropy --class-axis last --device cuda --precision bf16 --optimizer sgd --lr 0.01 -o /tmp/s29/imported.exe 2>&1 | tail -1
timeout 120 $PROF /tmp/s29/imported.exe --top 40 > $OUT/profile-imported.txt 2>&1; echo "exit $?"
head -60 $OUT/profile-imported.txt; t
echo "== 2. larger GPTs (docs/results/gpu-s28-larger-gpts-script.sh), limit $(( 520 - $(date +%s) + START )) s"
OUT=$OUT/larger LIMIT=$(( 520 - $(date +%s) + START )) bash docs/results/gpu-s28-larger-gpts-script.sh 2>&1 | tail -40
t; echo "done"
