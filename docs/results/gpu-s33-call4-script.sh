#!/bin/bash
# Session 33, call 4 (one H200): test_cuda_random_graphs ran past its time in call 3 with the merged
# tree (NEW) where main before the merges (OLD) passed in 72 s on a two-H200 host (call 2): OLD and
# NEW timed one after the other on this host, then NEW's test_cuda (not reached in call 3).
# usage: bash docs/results/gpu-s33-call4-script.sh  (.devbin/bins.tgz NEW, .devbin/old.tgz OLD)
START=$(date +%s)
OUT=${OUT:-/tmp/s33-out}; mkdir -p $OUT
X=/tmp/s33aux; mkdir -p $X
exec > >(tee -a $OUT/log.txt) 2>&1
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-380} - $(date +%s) + START )); }
mkdir -p .devbin/new .devbin/old && tar xzf .devbin/bins.tgz -C .devbin/new && tar xzf .devbin/old.tgz -C .devbin/old
N=$PWD/.devbin/new; O=$PWD/.devbin/old
export LD_LIBRARY_PATH=$(python3 -c "import nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], 'lib'))"):$LD_LIBRARY_PATH
export INGOT_REQUIRE_GPU=1
nproc; uptime
for b in O N; do eval B=\$$b
  t0=$(date +%s)
  timeout 150 $B/test_cuda_random_graphs --test-threads=1 random_steps_on_the_gpu --nocapture > $X/rg_$b.txt 2>&1
  echo "$b random graphs rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E 'worst|^test result' $X/rg_$b.txt | tr '\n' ' ')"
done; t
timeout $(left) $N/test_cuda --test-threads=1 > $X/tc.txt 2>&1; echo "test_cuda rc=$?: $(grep -E '^test result' $X/tc.txt)"; grep -E "FAILED|panicked" $X/tc.txt | head -5; t
echo done
