#!/bin/bash
# Session 37, the lead's call (one H200, 16 cores): the merged tree (NEW: main with this
# session's five branches merged) against main at the session's start (OLD), in one call.
#  CPU, in the background at nice 19: the five libFuzzer targets (fuzz/), 2 workers each.
#  GPU, one thing at a time: 1. gpt2 bf16, resnet50 224 b128 bf16 and resnet18 bf16, OLD/NEW
#     alternating; 2. NEW's executables of the imported CNNs (channels-last convolutions at
#     cuDNN's floor); 3. resnet50's distinct fused kernels against the CPU (cuda_kernels);
#     4. the GPU tests (INGOT_REQUIRE_GPU=1), one binary at a time, until the time runs out.
# usage: bash docs/results/gpu-s37-final-script.sh  (.device-bin/lead/{new,old,fuzz}.txz)
X=/tmp/s37aux OUT=${OUT:-/tmp/s37-out}
. scripts/device_prelude.sh
L=.device-bin/lead
unpack() { python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2"; }
mkdir -p $X/new $X/old && unpack $L/new.txz $X/new && unpack $L/old.txz $X/old && unpack $L/fuzz.txz $X
N=$X/new; O=$X/old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
END=${END:-520}
FUZZ_S=$(( $(left $END) - 15 ))
bash $X/fuzzpack/run.sh $X/fuzzpack 2 $FUZZ_S $X/fz
echo "== 1a. gpt2 bf16 SGD 30 steps, OLD/NEW alternating"
for i in 1 2; do for b in O N; do eval B=\$$b
  echo -n "$b: "; timeout 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 30 --json 2>$X/g2.err | python3 scripts/summ.py || tail -2 $X/g2.err
done; done; t
echo "== 1b. resnet50 224 b128 bf16, 10 steps, OLD/NEW alternating (the default: cuDNN channels-last)"
R="--model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json"
for i in 1 2; do for b in O N; do eval B=\$$b
  echo -n "$b: "; timeout 60 $B/ingot train $R 2>$X/r50.err | python3 scripts/summ.py || tail -3 $X/r50.err
done; done; t
echo "== 1c. resnet18 (CIFAR) bf16, 30 steps, OLD/NEW alternating"
for i in 1 2; do for b in O N; do eval B=\$$b
  echo -n "$b: "; timeout 40 $B/ingot train --model resnet18 --device cuda --precision bf16 --steps 30 --json 2>$X/r18.err | python3 scripts/summ.py || tail -3 $X/r18.err
done; done; t
echo "== 2. NEW executables, 10 steps"
for e in $N/exes/*.exe; do
  [ $(left $END) -gt 60 ] || { echo "$(basename $e): not run (time)"; continue; }
  echo -n "$(basename $e): "; timeout 40 $N/ingot run $e --device cuda --steps 10 --json 2>$X/e.err | python3 scripts/summ.py || tail -2 $X/e.err
done; t
echo "== 3. cuda_kernels NEW: resnet50 side 56 batch 16 bf16 channels-last, each distinct fused kernel against the CPU"
INGOT_REQUIRE_GPU=1 timeout 60 $N/cuda_kernels --precision bf16 --channels-last resnet:depth=50,side=56,batch=16 > $X/kernels.txt 2>&1; echo "rc=$?"
grep -E -i "mismatch|fail|panick|distinct|checked|kernels" $X/kernels.txt | head -8; tail -3 $X/kernels.txt; t
echo "== 4. GPU tests (NEW)"
gpu_test_lane 0 $END $N test_cuda_kernels test_cuda_attention test_cuda_channels_last test_cuda_cudnn test_cuda_bf16 test_cuda_conv test_cuda test_cuda_matmul_acc test_cuda_sums test_cuda_random_graphs test_cuda_offload test_cuda_eval test_cuda_generate
cat $X/lane_tests.txt; t
echo "== fuzzing (5 targets x 2 workers, $FUZZ_S s each worker, nice 19)"
for p in $(cat $X/fz/pids); do while kill -0 $p 2>/dev/null; do sleep 2; done; done
for tg in ir_text executable safetensors plan_validate fused_step; do
  runs=$(grep -h "^Done" $X/fz/$tg/fuzz-*.log 2>/dev/null | awk '{s+=$2} END {print s+0}')
  echo "$tg: $(ls $X/fz/$tg/fuzz-*.log 2>/dev/null | wc -l) workers, $runs runs, $(ls $X/fz/$tg/art | wc -l) crash files; $(tail -1 $X/fz/$tg/log.txt)"
  for a in $(ls $X/fz/$tg/art | head -3); do echo "  $a"; grep -h -A3 "panicked" $X/fz/$tg/fuzz-*.log | head -8; done
done
mkdir -p $OUT/finds && for tg in ir_text executable safetensors plan_validate fused_step; do for a in $(ls $X/fz/$tg/art | head -1); do cp $X/fz/$tg/art/$a $OUT/finds/$tg-$a; done; done
t; echo done
