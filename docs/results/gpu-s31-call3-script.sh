#!/bin/bash
# Session 31, call 3 (one H200): the merged tree. NEW = main after the session's merges
# (.devbin/ingot, scripts/gpu_build.sh); OLD = call 1's binary (main a62a2de: the head padded, its
# gradient copied) as .devbin/ingot_old. The test binaries travel compressed (.devbin/bins.tgz).
#  1. every GPU test binary, INGOT_REQUIRE_GPU=1, one test at a time.
#  2. gpt2 bf16 AdamW, OLD and NEW alternating, 30 steps: step time, memory, last loss.
#  3. gpt2's shape at vocab 50257 (padded, its gradient now widened) and 50304, NEW, SGD bf16.
#  4. transformers' GPT-2 small imported, OLD and NEW alternating (bf16, SGD, 30 steps).
# usage: bash docs/results/gpu-s31-call3-script.sh
START=$(date +%s)
S=$PWD/scripts
OUT=${OUT:-/tmp/s31-out}; mkdir -p $OUT
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { [ $(( $(date +%s) - START )) -lt $1 ]; }
mkdir -p /tmp/bins && tar xzf .devbin/bins.tgz -C /tmp/bins
B=/tmp/bins; NEW=$B/ingot; OLD=$B/ingot_old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0] + '/lib')"):$LD_LIBRARY_PATH
echo "== 1. GPU tests (INGOT_REQUIRE_GPU=1)"
for tb in $B/test_*; do
  left 300 || { echo "$(basename $tb): not run (time)"; continue; }
  INGOT_REQUIRE_GPU=1 timeout 120 $tb --test-threads=1 > $OUT/$(basename $tb).txt 2>&1; rc=$?
  echo "$(basename $tb): exit $rc, $(grep -h '^test result' $OUT/$(basename $tb).txt | head -1)"; grep -h "FAILED\|panicked" $OUT/$(basename $tb).txt | head -5
done; t
G="d_model=768,layers=12,heads=12,d_ff=3072,seq=1024,batch=8"
echo "== 2. gpt2 bf16 AdamW, OLD and NEW alternating, 30 steps"
for i in 1 2; do for b in $OLD $NEW; do
  echo -n "$(basename $b): "; timeout 60 $b train --model gpt2 --device cuda --precision bf16 --steps 30 --json 2>/dev/null | python3 $S/summ.py
done; done; t
echo "== 3. vocab 50257 and 50304, NEW, SGD lr 0.01, bf16, 20 steps"
for i in 1 2; do for v in 50257 50304; do
  echo -n "vocab $v: "; timeout 60 $NEW train --model gpt:vocab=$v,$G --optimizer sgd --lr 0.01 --device cuda --precision bf16 --steps 20 --json 2>/dev/null | python3 $S/summ.py
done; done; t
if left 470; then
echo "== 4. transformers' GPT-2 small imported, OLD and NEW alternating"
o=/tmp/s31/gpt2_124m; mkdir -p $o
timeout 120 python3 $S/onnx_real_models/models.py gpt2_124m $o > $OUT/export.txt 2>&1; tail -1 $OUT/export.txt; ls $o; t
for i in 1 2; do for b in $OLD $NEW; do
  left 560 || break
  echo -n "imported GPT-2 $(basename $b): "; timeout 60 $b train --onnx $o/det.onnx --loss cross-entropy --device cuda --precision bf16 --init $o/state_dict.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>$OUT/g2i.err | python3 $S/summ.py || tail -3 $OUT/g2i.err
done; done; t
fi
echo done
