#!/bin/bash
# Session 33, call 1 (two H200s of one host): every GPU test binary with INGOT_REQUIRE_GPU=1
# (issue 47's check; the tests were last run in session 31), split over the two GPUs, the two-GPU
# tests first; GPT-2 large's shape (774 M parameters, >2 GiB: external data) exported by
# transformers, imported, planned and trained strict f32 beside PyTorch's losses (issue 46);
# gpt2 bf16 step time (issue 47: unchanged after the splits; session 25: 20.04-20.17 ms).
# usage: bash docs/results/gpu-s33-call1-script.sh   (binaries from scripts/gpu_build.sh in .devbin/bins.tgz)
START=$(date +%s)
OUT=${OUT:-/tmp/s33-out}; mkdir -p $OUT
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-585} - $(date +%s) + START )); }
mkdir -p .devbin/x && tar xzf .devbin/bins.tgz -C .devbin/x
B=$PWD/.devbin/x
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], 'lib'))"):$(python3 -c "import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], 'lib'))" 2>/dev/null):$LD_LIBRARY_PATH
export INGOT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
W=/tmp/s33/gpt2_large; mkdir -p $W
( CUDA_VISIBLE_DEVICES=1 BATCH=2 timeout 330 python3 scripts/onnx_real_models/models.py gpt2_large $W > $OUT/gpt2_large_export.txt 2>&1; echo "export rc=$? at t=$(( $(date +%s) - START )) s" >> $OUT/gpt2_large_export.txt ) &
EXPORT=$!
one() { # gpu limit binary
  local g=$1 lim=$2 tb=$3
  [ $(left) -gt 20 ] || { echo "$tb: not run (time)"; return; }
  [ $lim -lt $(left) ] || lim=$(left)
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=$g timeout $lim $B/$tb --test-threads=1 > $OUT/$tb.txt 2>&1
  echo "$tb (gpu $g): rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E '^test result' $OUT/$tb.txt | tr '\n' ' ')"
}
echo "== two-GPU tests"; t
one 0,1 90 test_cuda_nccl; one 0,1 120 test_cuda_ranks; t
echo "== the rest, two lanes"
( for tb in test_cuda test_cuda_kernels test_cuda_sums test_cuda_eval test_cuda_attention test_cuda_generate; do one 0 200 $tb; done ) &
L0=$!
( for tb in test_cuda_random_graphs test_cuda_bf16 test_cuda_conv test_cuda_cudnn test_cuda_matmul_acc; do one 1 220 $tb; done ) &
L1=$!
wait $L0; t
echo "== gpt2 bf16, SGD, 30 steps (GPU 0)"
for i in 1 2; do CUDA_VISIBLE_DEVICES=0 timeout 60 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 30 --json 2>$OUT/g2.err | python3 $B/summ.py || tail -3 $OUT/g2.err; done; t
wait $EXPORT; cat $OUT/gpt2_large_export.txt | grep -v -i "warn\|deprecat" | tail -6; ls -la $W; t
if [ -f $W/det.onnx ] && [ $(left) -gt 60 ]; then
  X="--loss cross-entropy --class-axis last"
  echo "== ingot plan --onnx gpt2_large"; CUDA_VISIBLE_DEVICES=0 timeout 90 $B/ingot plan --onnx $W/det.onnx $X --device cuda 2>&1 | tail -6; t
  echo "== ingot train strict f32 from torch's weights and batch, SGD lr 0.01, 5 steps (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 timeout $(left) $B/ingot train --onnx $W/det.onnx --loss cross-entropy --device cuda --init $W/state_dict.safetensors --data $W/batch.safetensors --optimizer sgd --lr 0.01 --steps 5 2>&1 | grep -v "^$" | tail -10
  cat $W/torch_losses.json; echo; t
fi
wait $L1; t
echo done
