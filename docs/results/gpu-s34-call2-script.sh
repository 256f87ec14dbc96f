#!/bin/bash
# Session 34, call 2 (two H200s, 32 cores): the merged tree (NEW: main with this session's
# branches) against session 33's build (OLD: main at 2889ba9), alternating in one call.
#  GPU 1, in the background: the GPU tests with NEW (INGOT_REQUIRE_GPU=1), test_cuda first
#     (issue 47's check of the merged tree), then the tests of this session's changes.
#  GPU 0: 1. gpt2 bf16 OLD/NEW alternating (issue 47: unchanged; issue 52: column reductions);
#         2. resnet50 224 batch 128 bf16, cuDNN, OLD (NCHW) / NEW (channels-last), alternating
#            (issue 48); 3. the 1.3B GPT at --budget 16GiB by offload, NEW (issue 51).
#  Then, the GPUs idle: CPU cnn and resnet18 on 16 threads, OLD/NEW and PyTorch eager (issue 49).
# usage: bash docs/results/gpu-s34-call2-script.sh  (.device-bin/new.tgz NEW, .device-bin/old.tgz OLD)
START=$(date +%s)
OUT=${OUT:-/tmp/s34-out}; mkdir -p $OUT
X=/tmp/s34aux; mkdir -p $X  # only log.txt comes back
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-580} - $(date +%s) + START )); }
mkdir -p $X/new $X/old && tar xzf .device-bin/new.tgz -C $X/new && tar xzf .device-bin/old.tgz -C $X/old
N=$X/new; O=$X/old
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], 'lib'))"):$LD_LIBRARY_PATH
export INGOT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
(
  export CUDA_VISIBLE_DEVICES=1
  for tb in test_cuda_channels_last test_cuda_offload test_cuda test_cuda_cudnn test_cuda_conv test_cuda_kernels test_cuda_attention test_cuda_eval test_cuda_generate test_cuda_sums test_cuda_matmul_acc test_cuda_bf16; do
    [ $(left 470) -gt 20 ] || { echo "$tb: not run (time)"; continue; }
    s=$(date +%s); timeout $(left 470) $N/$tb --test-threads=1 > $X/$tb.txt 2>&1; rc=$?
    echo "$tb rc=$rc $(( $(date +%s) - s )) s: $(grep -E '^test result' $X/$tb.txt | tail -1)"; grep -E "FAILED|panicked" $X/$tb.txt | head -5
  done > $X/lane_tests.txt 2>&1
) &
LANE=$!
export CUDA_VISIBLE_DEVICES=0
echo "== 1. gpt2 bf16 SGD 30 steps, OLD/NEW alternating"
for i in 1 2; do for b in O N; do eval B=\$$b
  echo -n "$b: "; timeout 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 30 --json 2>$X/g2.err | python3 $N/summ.py || tail -2 $X/g2.err
done; done; t
echo "== 2. resnet50 224 b128 bf16 cudnn, OLD/NEW alternating, 10 steps"
for i in 1; do for b in O N; do eval B=\$$b
  echo -n "$b: "; INGOT_CONV=cudnn timeout 90 $B/ingot train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 10 --json 2>$X/r50.err | python3 $N/summ.py || tail -3 $X/r50.err
done; done; t
echo "== 3. 1.3B GPT bf16 AdamW --budget 16GiB (offload), NEW"
s=$(date +%s)
timeout $(left 520) $N/ingot train --model gpt:vocab=50304,d_model=2048,layers=24,heads=16,d_ff=8192,seq=1024,batch=8 --device cuda --precision bf16 --optimizer adamw --budget 16GiB --steps 5 --json > $X/g13.json 2>$X/g13.err
echo "rc=$? $(( $(date +%s) - s )) s"; python3 $N/summ.py < $X/g13.json; tail -3 $X/g13.err; grep -c '"loss"' $X/g13.json; t
wait $LANE; echo "== GPU tests (NEW, GPU 1)"; cat $X/lane_tests.txt; t
echo "== 4. CPU, 16 threads: cnn and resnet18"
for b in O N; do eval B=\$$b
  [ $(left) -gt 40 ] || break
  sys="ingot"; [ $b = N ] && sys="ingot torch-eager"
  BIN=$B/ingot timeout $(left) python3 scripts/cpu_bench.py --threads 16 --models resnet18 cnn --systems $sys --timeout 60 2>$X/cpu_$b.err | tee $X/cpu_$b.md
done; t
echo done
