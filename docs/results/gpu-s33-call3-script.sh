#!/bin/bash
# Session 33, call 3 (one H200, 16 cores): the merged tree (NEW: helpers A-E merged) against main
# before them (OLD: call 1's binaries, cfa87b2).
#  1. resnet50 224 bf16 (INGOT_CONV=cudnn) profile, OLD and NEW alternating: batch norm's
#     reductions split by stages (issue 48).
#  2. NEW's kernels of resnet50 at batch 32, bf16, each against the CPU (cuda_kernels).
#  3. GPU tests touched by the merge (test_cuda_conv: resnet18 and cnn against the CPU;
#     test_cuda; test_cuda_random_graphs), INGOT_REQUIRE_GPU=1.
#  4. gpt2 bf16, OLD and NEW alternating (rewrite and fusion sped up, plans identical).
#  5. CPU: cnn and resnet18, Ingot OLD and NEW beside PyTorch eager on the host's 16 cores
#     (convolution lanes and max pooling, issues 49, 48).
# usage: bash docs/results/gpu-s33-call3-script.sh  (.devbin/bins.tgz NEW, .devbin/old.tgz OLD)
START=$(date +%s)
OUT=${OUT:-/tmp/s33-out}; mkdir -p $OUT
X=/tmp/s33aux; mkdir -p $X  # only log.txt comes back (a call returns at most 8 files)
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-580} - $(date +%s) + START )); }
mkdir -p .devbin/new .devbin/old && tar xzf .devbin/bins.tgz -C .devbin/new && tar xzf .devbin/old.tgz -C .devbin/old
N=$PWD/.devbin/new; O=$PWD/.devbin/old
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], 'lib'))"):$LD_LIBRARY_PATH
export INGOT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
M=resnet:depth=50,side=224,batch=128
echo "== 1. resnet50 profile, cudnn, OLD/NEW alternating"
for i in 1 2; do for b in O N; do
  echo "-- $b round $i"; eval B=\$$b
  INGOT_CONV=cudnn timeout 120 $B/cuda_profile $M --precision bf16 --top 14 > $X/prof_${b}_$i.txt 2>&1
  head -6 $X/prof_${b}_$i.txt; [ $i = 1 ] && sed -n 7,22p $X/prof_${b}_$i.txt
done; done; t
echo "== 2. cuda_kernels resnet50 batch 32 bf16 (NEW)"
INGOT_CONV=cudnn timeout 150 $N/cuda_kernels --precision bf16 resnet:depth=50,side=224,batch=32 > $X/kernels.txt 2>&1; echo "rc=$?"; tail -6 $X/kernels.txt; t
echo "== 3. GPU tests (NEW)"
for tb in test_cuda_conv test_cuda_random_graphs test_cuda; do
  [ $(left 430) -gt 30 ] || { echo "$tb: not run (time)"; continue; }
  timeout $(left 430) $N/$tb --test-threads=1 > $X/$tb.txt 2>&1; echo "$tb rc=$?: $(grep -E '^test result' $X/$tb.txt)"; grep -E "FAILED|panicked" $X/$tb.txt | head -5
done; t
echo "== 4. gpt2 bf16 SGD 30 steps, OLD/NEW alternating"
for i in 1 2; do for b in O N; do eval B=\$$b
  echo -n "$b: "; timeout 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 30 --json 2>$X/g2.err | python3 $N/summ.py || tail -2 $X/g2.err
done; done; t
echo "== 5. CPU, 16 threads: cnn and resnet18"
for b in O N; do eval B=\$$b
  [ $(left) -gt 40 ] || break
  sys="ingot"; [ $b = N ] && sys="ingot torch-eager"
  BIN=$B/ingot timeout $(left) python3 scripts/cpu_bench.py --threads 16 --models cnn resnet18 --systems $sys --timeout 100 2>$X/cpu_$b.err | tee $X/cpu_$b.md
done; t
echo done
