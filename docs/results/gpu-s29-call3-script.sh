#!/bin/bash
# This call ran out of its 500 s limit and returned no output at all: every line went through `| tail -120`,
# which prints only when the script ends. What it left on the machine (/tmp/s29c: the three exported models) served
# calls 4 and 5. Scripts since write their log under $OUT as they go.
# Session 29, call 3 (one H200): convolutions through cuDNN (branch s29-d merged with the lead's
# dependency change). NEW = that tree's ingot (.devbin/ingot); the im2col path is the same binary
# with INGOT_CONV=im2col. CUDNN_TEST = trainer/tests/cuda_cudnn.rs, CUDA_TEST = cli/tests/cuda.rs.
# usage: bash docs/results/gpu-s29-call3-script.sh   (writes nothing outside /tmp and $OUT)
START=$(date +%s)
NEW=$PWD/.devbin/ingot
S=$PWD/scripts
R=$S/onnx_real_models
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { [ $(( $(date +%s) - START )) -lt $1 ]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0] + '/lib')"):$LD_LIBRARY_PATH
ls ${LD_LIBRARY_PATH%%:*} | head -3
echo "== 1. the cuDNN GPU tests (INGOT_REQUIRE_GPU=1, INGOT_LOG=1)"
INGOT_REQUIRE_GPU=1 INGOT_LOG=1 timeout 150 .devbin/cuda_cudnn --test-threads=1 --nocapture 2>&1 | grep -v "^$" | tail -40; t
echo "== 2. the CUDA integration tests (INGOT_REQUIRE_GPU=1)"
INGOT_REQUIRE_GPU=1 timeout 150 .devbin/cuda_test --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tail -20; t
run() {  # name, extra flags; env INGOT_CONV passes through
  o=/tmp/s29c/$1
  timeout 120 $NEW train --onnx $o/det.onnx $2 --device cuda --precision bf16 --init $o/state_dict.safetensors --data $o/batch.safetensors --optimizer sgd --lr 0.01 --steps 30 --json 2>$o/err.txt | python3 -c "
import sys; sys.path.insert(0, '$S')
from summ import read_run
l, s = read_run(sys.stdin)
print('no summary' if s is None else 'step_ms %.3f planned %.1f MiB measured %.1f MiB losses %s' % (s['median_step_seconds']*1e3, s['planned_bytes']/2**20, (s.get('measured_bytes') or 0)/2**20, [round(v, 5) for v in l[:5]]))" || tail -3 $o/err.txt
}
echo "== 3. resnet50 (batch 128), efficientnet_b0 and convnext_tiny (batch 32) imported, bf16: cuDNN then im2col, alternating"
for spec in resnet50:128 convnext_tiny:32 efficientnet_b0:32; do
  name=${spec%%:*}; b=${spec##*:}
  left 380 || { echo "$name: skipped (time)"; continue; }
  o=/tmp/s29c/$name; mkdir -p $o
  BATCH=$b DET_ONLY=1 timeout 120 python3 $R/models.py $name $o 2>&1 | grep -v -i "warn\|record function\|deprecat" | tail -1
  for i in 1 2; do
    echo -n "$name cudnn:  "; run $name "--loss cross-entropy"
    echo -n "$name im2col: "; INGOT_CONV=im2col run $name "--loss cross-entropy"
  done; t
done
if left 420; then
echo "== 4. resnet50 (batch 128) beside torch.compile (channels_last, bf16): bench.sh"
WORK=/tmp/s29d BUDGET_S=60 BATCH=128 MODELS="resnet50" BIN=$NEW bash $R/bench.sh 2>&1 | grep -v "^done" | tail -4; t
fi
echo "done"
