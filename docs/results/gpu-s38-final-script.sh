#!/bin/bash
# Session 38, the lead's final call (two H200s, 32 cores): the merged tree (NEW: main with this
# session's branches) against main at the session's start (OLD, afe8d40), in one call.
#  CPU, at nice 19 the whole call: the five libFuzzer targets (scripts/fuzz_run.sh), W workers
#     each; their CPU seconds are counted from `times` (issue 53's hour a target).
#  GPU 0: the GPU tests (INGOT_REQUIRE_GPU=1), one binary at a time, the ones session 37 did
#     not run first.
#  GPU 1, one thing at a time: gpt2 bf16, resnet50 224 b128 bf16 and resnet18 bf16, OLD/NEW
#     alternating; resnet50 at PyTorch's checkpointed peak P (executables fitted here);
#     torchvision resnet50 under torch.compile beside them; NEW's fused kernels of resnet50
#     against the CPU; efficientnet_b0's executable, timed from load.
# usage: W=6 END=560 bash docs/results/gpu-s38-final-script.sh  (.device-bin/lead/{new,old,fuzz}.txz)
X=/tmp/s38fin; . scripts/device_prelude.sh
L=.device-bin/lead
unpack() { python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2"; }
mkdir -p $X/new $X/old && unpack $L/new.txz $X/new && unpack $L/old.txz $X/old && unpack $L/fuzz.txz $X
N=$X/new; O=$X/old; END=${END:-560}; W=${W:-6}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
FUZZ_S=$(( $(left $END) - 25 ))
bash scripts/fuzz_run.sh $X/fuzzpack $W $FUZZ_S $X/fz
echo "fuzzing: 5 targets x $W workers, $FUZZ_S s, nice 19"
gpu_test_lane 0 $(( END - 10 )) $N test_cuda_bf16 test_cuda_conv test_cuda test_cuda_matmul_acc test_cuda_sums \
  test_cuda_random_graphs test_cuda_offload test_cuda_eval test_cuda_generate test_cuda_kernels \
  test_cuda_channels_last test_cuda_cudnn test_cuda_attention &
LANE=$!
export CUDA_VISIBLE_DEVICES=1
run() { # label, timeout, binary, args...: one summary line
  local l=$1 s=$2 b=$3; shift 3
  echo -n "$l: "; timeout $s $b "$@" 2>$X/run.err | python3 scripts/summ.py || tail -3 $X/run.err
}
echo "== 1. gpt2 bf16 SGD lr 0.01, 20 steps, OLD/NEW alternating"
for i in 1 2; do for b in O N; do eval B=\$$b
  run $b 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 20 --json
done; done; t
echo "== 2. resnet50 224 b128 bf16, 10 steps (the default: cuDNN channels-last)"
for i in 1 2; do for b in O N; do eval B=\$$b
  run $b 60 $B/ingot train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json
done; done; t
echo "== 3. resnet18 (CIFAR) bf16, 30 steps"
for i in 1 2; do for b in O N; do eval B=\$$b
  run $b 30 $B/ingot train --model resnet18 --device cuda --precision bf16 --steps 30 --json
done; done; t
echo "== 4. resnet50 224 b128 bf16 fitted to P = 2,916,900,864 B (PyTorch's checkpointed peak, session 36), 10 steps"
for b in O N; do eval B=\$$b
  run "$b at P" 60 $B/ingot run $B/exes/r50-at-P.exe --device cuda --steps 10 --json
done; t
echo "== 5. torchvision resnet50 224 b128 under torch.compile, channels_last, bf16 autocast"
timeout $(( $(left $END) - 150 )) python3 scripts/resnet_beside_torch.py --depth 50 --side 224 --batch 128 --precision bf16 2>&1 | tail -2; t
echo "== 6. NEW cuda_kernels: resnet50 side 56 b16 bf16 channels-last, each distinct fused kernel against the CPU"
INGOT_REQUIRE_GPU=1 timeout 60 $N/cuda_kernels --precision bf16 --channels-last resnet:depth=50,side=56,batch=16 > $X/k.txt 2>&1; echo "rc=$?"
grep -E -i "mismatch|fail|panick|distinct" $X/k.txt | head -4; t
echo "== 7. NEW efficientnet_b0 (ONNX, batch 32, bf16) executable: 3 steps, timed from load"
S=$(date +%s.%N); timeout $(( $(left $END) - 20 )) $N/ingot run $N/exes/efficientnet_b0.exe --device cuda --steps 3 --json > $X/eff.out 2>$X/eff.err; rc=$?
echo "rc=$rc after $(python3 -c "import time; print(round(time.time() - $S, 1))") s"; python3 scripts/summ.py < $X/eff.out; tail -3 $X/eff.err; t
unset CUDA_VISIBLE_DEVICES
wait $LANE; echo "== GPU tests (NEW, GPU 0)"; cat $X/lane_tests.txt; t
for p in $(cat $X/fz/pids); do while kill -0 $p 2>/dev/null; do sleep 2; done; done
echo "== fuzzing"; bash scripts/fuzz_run.sh --summary $X/fz
mkdir -p $OUT/finds && for tg in ir_text executable safetensors plan_validate fused_step; do for a in $(ls $X/fz/$tg/art | head -1); do cp $X/fz/$tg/art/$a $OUT/finds/$tg-$a; done; done
tar cf - -C $X/fz $(cd $X/fz && ls -d */corpus) | xz -T8 > $OUT/corpus.txz; ls -la $OUT/corpus.txz; t; echo done
