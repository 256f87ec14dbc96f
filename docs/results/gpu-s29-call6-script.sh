#!/bin/bash
# Session 29, call 6 (one H200): the merged tree. NEW = main after the session's merges
# (.devbin/ingot), OLD = main at the session's start with s29-t's IR-text layer lines (no kernel or runtime change; .devbin/ingot_old);
# .devbin/cuda_cudnn, cuda_conv = trainer/tests/cuda_{cudnn,conv}.rs, cuda_test = cli/tests/cuda.rs, all from NEW's tree.
# Every line goes to $OUT/log.txt as it is written (call 3 lost its output to a buffering tail).
# usage: bash docs/results/gpu-s29-call6-script.sh
START=$(date +%s)
NEW=$PWD/.devbin/ingot
OLD=$PWD/.devbin/ingot_old
S=$PWD/scripts
R=$S/onnx_real_models
OUT=${OUT:-/tmp/s29-out}; mkdir -p $OUT
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { [ $(( $(date +%s) - START )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0] + '/lib')"):$LD_LIBRARY_PATH
echo "== 1. the cuDNN GPU tests (INGOT_LOG=1: each convolution's timed choice) and the convolution tests of the default path (INGOT_REQUIRE_GPU=1)"
INGOT_REQUIRE_GPU=1 INGOT_LOG=1 timeout 60 .devbin/cuda_cudnn --test-threads=1 --nocapture > $OUT/cudnn-tests.txt 2>&1; grep -E "^test |test result|panicked" $OUT/cudnn-tests.txt
INGOT_REQUIRE_GPU=1 timeout 60 .devbin/cuda_conv --test-threads=1 2>&1 | grep -E "^test |test result|panicked"; t
echo "== 2. gpt2 bf16 (AdamW), OLD and NEW alternating, 30 steps"
for i in 1 2; do for b in $OLD $NEW; do
  echo -n "$(basename $b): "; timeout 60 $b train --model gpt2 --device cuda --precision bf16 --steps 30 --json 2>/dev/null | python3 $S/summ.py
done; done; t
echo "== 3. gpt2's shape with the vocabulary unpadded (50257, as transformers' GPT-2) and padded (50304), SGD lr 0.01, bf16, NEW"
for v in 50257 50304; do
  echo -n "vocab $v: "; timeout 60 $NEW train --model gpt:vocab=$v,d_model=768,layers=12,heads=12,d_ff=3072,seq=1024,batch=8 --optimizer sgd --lr 0.01 --device cuda --precision bf16 --steps 20 --json 2>/dev/null | python3 $S/summ.py
done; t
echo "== 4. CPU on the host's 16 cores, f32: OLD and NEW alternating (mlp 20 steps, gpt-mini 3 steps)"
for i in 1 2; do for b in $OLD $NEW; do
  echo -n "mlp $(basename $b): "; timeout 60 $b train --model mlp --device cpu --threads 16 --steps 20 --json 2>/dev/null | python3 $S/summ.py
  echo -n "gpt-mini $(basename $b): "; timeout 60 $b train --model gpt-mini --device cpu --threads 16 --steps 3 --json 2>/dev/null | python3 $S/summ.py
done; done; t
if left 200; then
echo "== 5. resnet50 imported, batch 128, bf16, NEW: default convolutions (im2col), then INGOT_CONV=cudnn (each convolution timed at load)"
o=/tmp/s29f/resnet50; mkdir -p $o
BATCH=128 DET_ONLY=1 timeout 90 python3 $R/models.py resnet50 $o 2>&1 | grep -v -i "warn\|record function\|deprecat" | tail -1; t
for conv in "" cudnn; do
  left 290 || break
  echo -n "resnet50 INGOT_CONV=$conv: "; INGOT_LOG=1 INGOT_CONV=$conv timeout 60 $NEW train --onnx $o/det.onnx --loss cross-entropy --device cuda --precision bf16 --init $o/state_dict.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 12 --json 2>$OUT/r50-conv$conv.err | python3 $S/summ.py; grep -c "cuDNN" $OUT/r50-conv$conv.err
done; t
fi
if left 250; then
echo "== 6. the CUDA integration tests (INGOT_REQUIRE_GPU=1)"
INGOT_REQUIRE_GPU=1 timeout $(( 320 - $(date +%s) + START )) .devbin/cuda_test --test-threads=1 2>&1 | grep -E "^test |test result|panicked"; t
fi
echo "done"
