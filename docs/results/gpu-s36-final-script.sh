#!/bin/bash
# Session 36, the lead's call (two H200s, 32 cores): the merged tree (NEW: main with this
# session's five branches merged) against session 35's build (OLD), in one call.
#  CPU, in the background from the start: the five libFuzzer targets (fuzz/), 5 workers each,
#     for most of the call (issue 53's "an hour of each fuzz target"; binaries built here with
#     nightly rustc and cargo-fuzz's instrumentation flags from main at 2ccc849).
#  GPU 1, in the background: the GPU tests with NEW (INGOT_REQUIRE_GPU=1), one at a time.
#  GPU 0: 1. gpt2 bf16 OLD/NEW alternating (same plan, step time; issue 47/52);
#     2. resnet50 224 b128 bf16: OLD INGOT_CONV=cudnn (timed at load), NEW default (cuDNN
#        channels-last for bf16, heuristic choice), twice (same bits), NEW INGOT_CONV=im2col;
#     3. resnet50 fitted by the fitter to PyTorch's checkpointed peak P and 0.75 P (issue 51).
# (The recorded run had the prelude and the test lane written out here; scripts/device_prelude.sh
# now holds them, the same commands.)
# usage: bash docs/results/gpu-s36-final-script.sh  (.device-bin/lead/{new,old,fuzz}.tgz)
X=/tmp/s36aux OUT=${OUT:-/tmp/s36-out}
. scripts/device_prelude.sh
L=.device-bin/lead
mkdir -p $X/new $X/old && tar xzf $L/new.tgz -C $X/new && tar xzf $L/old.tgz -C $X/old && tar xzf $L/fuzz.tgz -C $X
N=$X/new; O=$X/old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
FUZZ_S=$(( $(left 480) - 20 ))
bash $X/fuzzpack/run.sh $X/fuzzpack 5 $FUZZ_S $X/fz
gpu_test_lane 1 440 $N test_cuda_channels_last test_cuda_cudnn test_cuda_conv test_cuda test_cuda_kernels test_cuda_attention test_cuda_eval test_cuda_sums test_cuda_matmul_acc test_cuda_offload test_cuda_bf16 &
LANE=$!
export CUDA_VISIBLE_DEVICES=0
echo "== 1. gpt2 bf16 SGD 30 steps, OLD/NEW alternating"
for i in 1 2; do for b in O N; do eval B=\$$b
  echo -n "$b: "; timeout 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 30 --json 2>$X/g2.err | python3 $N/summ.py || tail -2 $X/g2.err
done; done; t
echo "== 2. resnet50 224 b128 bf16, 10 steps: OLD cudnn (timed), NEW default twice, NEW im2col"
R="--model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json"
echo -n "OLD INGOT_CONV=cudnn: "; INGOT_CONV=cudnn timeout 90 $O/ingot train $R 2>$X/r50.err | python3 $N/summ.py || tail -3 $X/r50.err
for i in 1 2; do echo -n "NEW default ($i): "; timeout 90 $N/ingot train $R 2>$X/r50.err | python3 $N/summ.py || tail -3 $X/r50.err; done
echo -n "NEW INGOT_CONV=im2col: "; INGOT_CONV=im2col timeout 90 $N/ingot train $R 2>$X/r50.err | python3 $N/summ.py || tail -3 $X/r50.err
t
echo "== 3. resnet50 fitted to PyTorch's checkpointed peak P = 2,916,900,864 B and 0.75 P (NEW default)"
for B in 2916900864 2187675648; do
  [ $(left 470) -gt 40 ] || { echo "budget $B: not run (time)"; continue; }
  echo -n "budget $B: "; timeout $(left 470) $N/ingot train $R --budget $B 2>$X/r50f.err | python3 $N/summ.py || tail -3 $X/r50f.err
  grep -m1 "^fitted" $X/r50f.err
done; t
wait $LANE; echo "== GPU tests (NEW, GPU 1)"; cat $X/lane_tests.txt; t
echo "== fuzzing (5 targets x 5 workers, $FUZZ_S s each worker)"
# run.sh's workers are not this shell's children (in the recorded run a `wait` here returned at
# once and the call ended before them): poll until they are gone.
for p in $(cat $X/fz/pids); do while kill -0 $p 2>/dev/null; do sleep 2; done; done
for tg in ir_text executable safetensors plan_validate fused_step; do
  runs=$(grep -h "^Done" $X/fz/$tg/fuzz-*.log 2>/dev/null | awk '{s+=$2} END {print s+0}')
  echo "$tg: $(ls $X/fz/$tg/fuzz-*.log 2>/dev/null | wc -l) workers, $runs runs, $(ls $X/fz/$tg/art | wc -l) crash files; $(tail -1 $X/fz/$tg/log.txt)"
  for a in $(ls $X/fz/$tg/art | head -3); do echo "  $a"; grep -h -A3 "panicked" $X/fz/$tg/fuzz-*.log | head -8; done
done
mkdir -p $OUT/finds && for tg in ir_text executable safetensors plan_validate fused_step; do for a in $(ls $X/fz/$tg/art | head -1); do cp $X/fz/$tg/art/$a $OUT/finds/$tg-$a; done; done
t; echo done
