#!/bin/bash
# Session 35, the lead's call (two H200s, 32 cores): the merged tree (NEW: main with this
# session's branches) against session 34's build (OLD: main at d2f0cc5), alternating in one call.
#  CPU, in the background from the start: 1,000,000 random training steps (seeds 1,000,000 to
#     1,999,999, testkit's random_steps: each seed's step compiled and run on the CPU against the
#     unfused reference interpreter) over 22 processes (issue 53's goal).
#  GPU 1, in the background: the GPU tests with NEW (INGOT_REQUIRE_GPU=1).
#  GPU 0: 1. gpt2 bf16 OLD/NEW alternating (issue 47: unchanged); 2. resnet50 224 batch 128
#     bf16: OLD cudnn, NEW cudnn (channels-last), NEW im2col (the default; issue 48's decision);
#     3. the 1.3B GPT at --budget 16GiB by offload, OLD and NEW plans (issue 51).
#  Then: CPU resnet18/cnn on 16 threads, OLD/NEW (issue 49).
# usage: bash docs/results/gpu-s35-final-script.sh  (.device-bin/new.tgz NEW, .device-bin/old.tgz OLD)
START=$(date +%s)
OUT=${OUT:-/tmp/s35-out}; mkdir -p $OUT
X=/tmp/s35aux; mkdir -p $X  # only log.txt comes back
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-500} - $(date +%s) + START )); }
mkdir -p $X/new $X/old && tar xzf .device-bin/new.tgz -C $X/new && tar xzf .device-bin/old.tgz -C $X/old
N=$X/new; O=$X/old
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], 'lib'))"):$LD_LIBRARY_PATH
export INGOT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
# 1M random steps: 22 processes of 45,455 seeds (the last takes the remainder).
mkdir -p $X/rs
P=22; FIRST=1000000; TOTAL=1000000; PER=$(( TOTAL / P ))
for i in $(seq 0 $((P-1))); do
  lo=$(( FIRST + i * PER )); hi=$(( lo + PER )); [ $i = $((P-1)) ] && hi=$(( FIRST + TOTAL ))
  ( INGOT_THREADS=1 timeout $(left 480) $N/random_steps $lo $hi > $X/rs/$i.txt 2>&1; echo "rc=$?" >> $X/rs/$i.txt ) &
done
(
  export CUDA_VISIBLE_DEVICES=1
  for tb in test_cuda_channels_last test_cuda_offload test_cuda test_cuda_cudnn test_cuda_conv test_cuda_kernels test_cuda_attention test_cuda_eval test_cuda_sums test_cuda_matmul_acc test_cuda_bf16; do
    [ $(left 450) -gt 20 ] || { echo "$tb: not run (time)"; continue; }
    s=$(date +%s); timeout $(left 450) $N/$tb --test-threads=1 > $X/$tb.txt 2>&1; rc=$?
    echo "$tb rc=$rc $(( $(date +%s) - s )) s: $(grep -E '^test result' $X/$tb.txt | tail -1)"; grep -E "FAILED|panicked" $X/$tb.txt | head -5
  done > $X/lane_tests.txt 2>&1
) &
LANE=$!
export CUDA_VISIBLE_DEVICES=0
echo "== 1. gpt2 bf16 SGD 30 steps, OLD/NEW alternating"
for i in 1 2; do for b in O N; do eval B=\$$b
  echo -n "$b: "; timeout 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 30 --json 2>$X/g2.err | python3 $N/summ.py || tail -2 $X/g2.err
done; done; t
echo "== 2. resnet50 224 b128 bf16, 10 steps: OLD cudnn, NEW cudnn, NEW im2col (default)"
R="--model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 10 --json"
echo -n "OLD cudnn: "; INGOT_CONV=cudnn timeout 90 $O/ingot train $R 2>$X/r50.err | python3 $N/summ.py || tail -3 $X/r50.err
echo -n "NEW cudnn: "; INGOT_CONV=cudnn timeout 90 $N/ingot train $R 2>$X/r50.err | python3 $N/summ.py || tail -3 $X/r50.err
echo -n "NEW im2col: "; timeout 90 $N/ingot train $R 2>$X/r50.err | python3 $N/summ.py || tail -3 $X/r50.err
t
echo "== 3. 1.3B GPT bf16 AdamW --budget 16GiB (offload), compiled here: OLD plan (staging from first use), NEW plan (prefetched); the same NEW runtime"
export INGOT_CACHE_DIR=/tmp/ingot-ptx
for r in new old; do
  lim=$(( $(left 470) < 110 ? $(left 470) : 110 )); [ $lim -gt 20 ] || { echo "$r: not run (time)"; continue; }
  s=$(date +%s); timeout $lim $N/ingot run .device-bin/g13/gpt13-$r.ingot --device cuda --steps 5 --json > $X/g13-$r.json 2>$X/g13.err
  echo "gpt13-$r: rc=$? $(( $(date +%s) - s )) s"; python3 $N/summ.py < $X/g13-$r.json; tail -2 $X/g13.err
done; t
wait $LANE; echo "== GPU tests (NEW, GPU 1)"; cat $X/lane_tests.txt; t
echo "== random steps (NEW, 22 processes)"; wait
cat $X/rs/*.txt | grep -E "^seed" | head -40
grep -h "rc=" $X/rs/*.txt | sort | uniq -c; for f in $X/rs/*.txt; do grep -E "seeds," $f | tail -1; done | head -30
python3 - $X/rs <<'PY'
import sys, glob, re
seeds = fails = 0; worst = 0.0
cut = 0
for f in glob.glob(sys.argv[1] + "/*.txt"):
    last = None  # the final summary, or the last progress line of a run that was cut
    for l in open(f):
        m = re.match(r"(progress: )?(\d+) seeds, (\d+) failures, largest difference ([0-9.]+)", l)
        if m:
            last = m
    if last:
        seeds += int(last[2]); fails += int(last[3]); worst = max(worst, float(last[4])); cut += bool(last[1])
print(f"{cut} of the processes were cut by the time limit (their counts are to their last progress line)")
print(f"random steps: {seeds} seeds finished, {fails} failures, largest difference {worst} of the tolerance")
PY
t
echo "== 4. CPU, 16 threads (the random steps finished): resnet18 and cnn, OLD/NEW and PyTorch eager"
for b in O N; do eval B=\$$b
  [ $(left 560) -gt 50 ] || { echo "$b: not run (time)"; break; }
  sys="ingot"; [ $b = N ] && sys="ingot torch-eager"
  timeout $(left 560) python3 scripts/cpu_bench.py --bin $B/ingot --threads 16 --models resnet18 cnn --systems $sys --timeout 40 2>$X/cpu_$b.err | tail -6
done; t
echo done
