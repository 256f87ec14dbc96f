#!/bin/bash
# Helper C, session 42, issue 48: convnext_tiny's depthwise convolutions by direct kernels.
# OLD = main at the session's start, NEW = branch s42-c. One H200.
D=.device-bin/c
X=/tmp/s42c
source $D/device_prelude.sh
python3 -c "
import lzma,shutil
for n in ['ingot','old-ingot','cuda_profile','cuda_depthwise']:
    with lzma.open('$D/'+n+'.xz') as f, open('$X/'+n,'wb') as g: shutil.copyfileobj(f,g)
"
chmod +x $X/ingot $X/old-ingot $X/cuda_profile $X/cuda_depthwise
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t; echo "== 1. bench.sh, NEW, convnext_tiny (export, torch bf16 losses, torch.compile step, Ingot NEW 30 steps)"
BIN=$X/ingot WORK=$X/w MODELS=convnext_tiny timeout 150 bash scripts/onnx_real_models/bench.sh
o=$X/w/convnext_tiny
ls $o
t; echo "== 2. convnext_tiny OLD and NEW alternated (30 steps each, bench.sh's flags)"
for r in 1 2; do
  for v in old-ingot ingot; do
    echo "-- $v (round $r) [$(t)]"
    timeout 60 $X/$v train --onnx $o/det.onnx --loss cross-entropy --device cuda --precision bf16 --init $o/state_dict.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>$X/$v-$r.err | tee $OUT/convnext-$v-$r.jsonl | python3 scripts/onnx_real_models/compare_bf16.py convnext_tiny $o || tail -3 $X/$v-$r.err
  done
done
t; echo "== 3. NEW's per-op profile"
timeout 40 $X/ingot compile --onnx $o/det.onnx --loss cross-entropy --device cuda --precision bf16 -o $X/new.ingot 2>&1 | tail -1
INGOT_LOG=1 timeout 60 $X/cuda_profile $X/new.ingot --top 45 > $OUT/convnext-profile-new.txt 2>$OUT/convnext-profile-new.err; echo rc=$?
head -60 $OUT/convnext-profile-new.txt; grep -c "depthwise" $OUT/convnext-profile-new.err
t; echo "== 4. GPU tests of the change"
CUDA_VISIBLE_DEVICES=0 INGOT_REQUIRE_GPU=1 timeout $(left 215) $X/cuda_depthwise --test-threads=1 > $OUT/cuda_depthwise.txt 2>&1; echo rc=$?
grep -E "^test |test result|rel " $OUT/cuda_depthwise.txt | head -40
t; echo done
