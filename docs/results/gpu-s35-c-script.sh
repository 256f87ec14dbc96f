#!/usr/bin/env bash
# Session 35, helper C (issue 51): offload's copies planned to overlap the compute, on one H200.
# Run from the root of a checkout as `bash .device-bin/c/gpu-s35-c-script.sh`, with
# .device-bin/c/ holding: ingot (this branch), test_cuda_offload (this branch's
# trainer/tests/cuda_offload.rs), summ.py, and the 1.3B GPT compiled on the CPU machine at
# --budget 16GiB by main before the session (gpt13-old.ingot: staging buffers live from their
# first use) and by this branch (gpt13-new.ingot: prefetched). The same runtime runs both, so
# the two differ only in their plans.
#  1. test_cuda_offload with INGOT_REQUIRE_GPU=1 (offloaded steps bit for bit as without
#     offload, planned device and host bytes held, nothing allocated per step, resume exact);
#  2. the two executables, 5 steps each, NEW OLD NEW OLD: median step time, planned and
#     measured device bytes, losses.
# One log: $OUT/gpu-s35-c.log.
set -uo pipefail
B=.device-bin/c
LOG=${OUT:-/tmp}/gpu-s35-c.log
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null)/lib:${LD_LIBRARY_PATH:-}
export INGOT_CACHE_DIR=/tmp/ingot-ptx
main() {
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv
echo "== test cuda_offload (NEW)"
SECONDS=0
INGOT_REQUIRE_GPU=1 timeout 30 $B/test_cuda_offload --test-threads=1
echo "test rc $? wall ${SECONDS} s"
# Call 1 ran with 40 s for the first run and 34 s for the others: too short for the 1.3B GPT's
# load (each was cut before its first step). RUN_S sets every run's limit.
t=${RUN_S:-40}
for r in new old new old; do
  echo "== ingot run gpt13-$r.ingot --device cuda --steps 5 --json"
  SECONDS=0
  timeout $t $B/ingot run $B/gpt13-$r.ingot --device cuda --steps 5 --json > /tmp/run-$r.json
  echo "run rc $? wall ${SECONDS} s"
  grep '"loss"' /tmp/run-$r.json | cut -c1-200
  python3 $B/summ.py < /tmp/run-$r.json
  t=${RUN_S:-34}
done
date -u
}
main 2>&1 | tee "$LOG"
