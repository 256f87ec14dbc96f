#!/bin/bash
# Session 39, the lead's second final call (the same two-H200 host, warm): the merged tree (NEW)
# against main at the session's start (OLD, 9c9f616), in one call.
#  GPU 1, one thing at a time: torchvision resnet50 224 b128 under torch.compile (channels_last,
#     bf16 autocast) first, on an idle CPU; then gpt2 bf16, resnet50 224 b128 bf16 and resnet18
#     bf16, OLD/NEW alternating; resnet50 at PyTorch's checkpointed peak P (executables fitted
#     here); NEW's fused kernels of resnet50 against the CPU; then the GPU tests of lane B.
#  GPU 0: the GPU tests (INGOT_REQUIRE_GPU=1), lane A, one binary at a time.
#  CPU, after torch.compile's run, at nice 19: the fused_step fuzz target, W workers, from the
#     corpus session 38 grew (issue 53: its uncounted second call).
# usage: W=6 END=570 bash docs/results/gpu-s39-final2-script.sh  (.device-bin/lead/{new,old,fuzz,corpus1}.txz)
X=/tmp/s39f2; . scripts/device_prelude.sh
L=.device-bin/lead
unpack() { python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2"; }
mkdir -p $X/new $X/old && unpack $L/new.txz $X/new && unpack $L/old.txz $X/old
N=$X/new; O=$X/old; END=${END:-570}; W=${W:-6}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
gpu_test_lane 0 $(( END - 10 )) $N test_cuda_random_graphs test_cuda_eval test_cuda_generate test_cuda_channels_last \
  test_cuda_cudnn test_cuda test_cuda_conv test_cuda_sums test_cuda_matmul_acc test_cuda_attention & LANE=$!
export CUDA_VISIBLE_DEVICES=1
echo "== 1. torchvision resnet50 224 b128 under torch.compile, channels_last, bf16 autocast (idle CPU)"
timeout 150 python3 scripts/resnet_beside_torch.py --depth 50 --side 224 --batch 128 --precision bf16 2>&1 | tail -2; t
if [ -f $L/fuzz.txz ]; then
  unpack $L/fuzz.txz $X && unpack $L/corpus1.txz $X/grown && cp -r $X/grown/fused_step/corpus/. $X/fuzzpack/corpus/fused_step/
  FUZZ_S=$(( $(left $END) - 25 ))
  TARGETS=fused_step bash scripts/fuzz_run.sh $X/fuzzpack $W $FUZZ_S $X/fz
  echo "fuzzing: fused_step x $W workers, $FUZZ_S s, nice 19, from session 38's grown corpus"
fi
run() { # label, timeout, binary, args...: one summary line
  local l=$1 s=$2 b=$3; shift 3
  echo -n "$l: "; timeout $s $b "$@" 2>$X/run.err | python3 scripts/summ.py || tail -3 $X/run.err
}
echo "== 2. gpt2 bf16 SGD lr 0.01, 20 steps, OLD/NEW alternating"
for i in 1 2; do for b in O N; do eval B=\$$b
  run $b 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 20 --json
done; done; t
echo "== 3. resnet50 224 b128 bf16, 10 steps (the default: cuDNN channels-last)"
for i in 1 2; do for b in O N; do eval B=\$$b
  run $b 60 $B/ingot train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json
done; done; t
if [ -x $N/ingot-cl ]; then
echo "== 3b. resnet50 as 3., NEW against NEW with every convolution channels-last (the stem too: MIN_CHANNELS_LAST_CHANNELS = 1, a build for this measure only)"
for i in 1 2; do for b in N CL; do B=$N/ingot; [ $b = CL ] && B=$N/ingot-cl
  run $b 60 $B train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json
done; done; t
fi
echo "== 4. resnet18 (CIFAR) bf16, 30 steps"
for i in 1 2; do for b in O N; do eval B=\$$b
  run $b 30 $B/ingot train --model resnet18 --device cuda --precision bf16 --steps 30 --json
done; done; t
echo "== 5. resnet50 224 b128 bf16 fitted to P = 2,916,900,864 B (PyTorch's checkpointed peak, session 36), 10 steps"
for b in O N; do eval B=\$$b
  run "$b at P" 60 $B/ingot run $B/exes/r50-at-P.exe --device cuda --steps 10 --json
done; t
echo "== 6. NEW cuda_kernels: resnet50 side 56 b16 bf16 channels-last, each distinct fused kernel against the CPU"
INGOT_REQUIRE_GPU=1 timeout 60 $N/cuda_kernels --precision bf16 --channels-last resnet:depth=50,side=56,batch=16 > $X/k.txt 2>&1; echo "rc=$?"
grep -E -i "mismatch|fail|panick|distinct" $X/k.txt | head -4; t
X0=$X; X=$X/l1; mkdir -p $X
gpu_test_lane 1 $(( END - 10 )) $N test_cuda_kernels test_cuda_offload test_cuda_conv_room test_cuda_bf16; X=$X0
unset CUDA_VISIBLE_DEVICES
wait $LANE; echo "== GPU tests (NEW; lane A on GPU 0, lane B on GPU 1)"; cat $X/lane_tests.txt $X/l1/lane_tests.txt; t
if [ -f $X/fz/pids ]; then
  for p in $(cat $X/fz/pids); do while kill -0 $p 2>/dev/null; do sleep 2; done; done
  echo "== fuzzing"; TARGETS=fused_step bash scripts/fuzz_run.sh --summary $X/fz
  mkdir -p $OUT/finds && for a in $(ls $X/fz/fused_step/art | head -1); do cp $X/fz/fused_step/art/$a $OUT/finds/fused_step-$a; done
fi
t; echo done
