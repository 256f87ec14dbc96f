#!/bin/bash
# Session 39, the lead's final calls on one H200 (two H200s were not lent at the time): the
# merged tree (NEW, built at e2ed5a4: every branch of the session merged; the last commit after
# it, ec1af2b, moves imports only) against main at the session's start (OLD, 9c9f616).
# PART=1: gpt2 bf16 OLD/NEW alternating (issue 47: unchanged), resnet50 224 b128 bf16 OLD/NEW
#   and NEW against a build with every convolution channels-last (CL: the stem too), then the
#   GPU tests (INGOT_REQUIRE_GPU=1), one binary at a time, until the call's time.
# PART=2 (the warm machine, right after): the GPU tests part 1 did not reach, resnet50 at
#   PyTorch's checkpointed peak P and resnet18, OLD and NEW.
# Both: the fused_step fuzz target at nice 19 on the CPU, W workers, from the corpus session 38
#   grew (part 2 continues part 1's corpus).
# usage: PART=1 END=560 W=6 bash docs/results/gpu-s39-final-script.sh  (.device-bin/lead/{new,old,fuzz,corpus1}.txz)
X=/tmp/s39f; . scripts/device_prelude.sh
L=.device-bin/lead; PART=${PART:-1}; END=${END:-560}; W=${W:-6}
unpack() { python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2"; }
if [ ! -x $X/new/ingot ]; then
  mkdir -p $X/new $X/old && unpack $L/new.txz $X/new && unpack $L/old.txz $X/old
  unpack $L/fuzz.txz $X && unpack $L/corpus1.txz $X/grown && cp -r $X/grown/fused_step/corpus/. $X/fuzzpack/corpus/fused_step/
fi
N=$X/new; O=$X/old
echo "part $PART"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
FZ=$X/fz$PART; [ $PART = 2 ] && cp -r $X/fz1/fused_step/corpus/. $X/fuzzpack/corpus/fused_step/ 2>/dev/null
TARGETS=fused_step bash scripts/fuzz_run.sh $X/fuzzpack $W $(( $(left $END) - 20 )) $FZ
run() { # label, timeout, binary, args...: one summary line
  local l=$1 s=$2 b=$3; shift 3
  echo -n "$l: "; timeout $s $b "$@" 2>$X/run.err | python3 scripts/summ.py || tail -3 $X/run.err
}
if [ $PART = 1 ]; then
  echo "== gpt2 bf16 SGD lr 0.01, 20 steps, OLD/NEW alternating"
  for i in 1 2; do for b in O N; do eval B=\$$b
    run $b 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 20 --json
  done; done; t
  echo "== resnet50 224 b128 bf16, 10 steps: OLD, NEW, CL (every convolution channels-last), NEW"
  run O 60 $O/ingot train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json
  run N 60 $N/ingot train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json
  run CL 60 $N/ingot-cl train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json
  run N 60 $N/ingot train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json
  t
  gpu_test_lane 0 $(( END - 25 )) $N test_cuda test_cuda_conv test_cuda_conv_room test_cuda_cudnn test_cuda_channels_last \
    test_cuda_sums test_cuda_matmul_acc test_cuda_attention test_cuda_offload test_cuda_eval test_cuda_generate test_cuda_kernels
else
  gpu_test_lane 0 $(( END - 150 )) $N ${TESTS:-test_cuda_bf16 test_cuda_random_graphs}
  echo "== resnet50 224 b128 bf16 fitted to P = 2,916,900,864 B, 10 steps"
  for b in O N; do eval B=\$$b; run "$b at P" 50 $B/ingot run $B/exes/r50-at-P.exe --device cuda --steps 10 --json; done; t
  echo "== resnet18 (CIFAR) bf16, 30 steps"
  for b in O N; do eval B=\$$b; run $b 25 $B/ingot train --model resnet18 --device cuda --precision bf16 --steps 30 --json; done; t
fi
echo "== GPU tests (NEW, part $PART)"; cat $X/lane_tests.txt; t
for p in $(cat $FZ/pids); do while kill -0 $p 2>/dev/null; do sleep 2; done; done
echo "== fuzzing, part $PART"; TARGETS=fused_step bash scripts/fuzz_run.sh --summary $FZ
mkdir -p $OUT/finds && for a in $(ls $FZ/fused_step/art | head -1); do cp $FZ/fused_step/art/$a $OUT/finds/fused_step-$a; done
t; echo done
