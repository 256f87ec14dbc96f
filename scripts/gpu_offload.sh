#!/usr/bin/env bash
# Offload on CUDA (issue 51), on a GPU machine, from binaries built here into .devbin/ (the
# ingot program, the cuda_offload test as .devbin/test_cuda_offload, scripts/summ.py):
#  1. the GPU test: an offloaded step trains bit for bit as the step without offload, takes its
#     planned device and host bytes, allocates nothing per step, resumes exactly;
#  2. the 1.3B GPT, bf16 AdamW, at --budget 16GiB (fits by offload) and at 24GiB (fits
#     by recomputation alone): 5 steps each, step time, planned and measured device bytes (the
#     driver's free memory, and nvidia-smi's peak while it runs), planned and held host bytes.
# Everything goes to one log, $OUT/gpu-offload.log (or stdout without $OUT).
set -uo pipefail
LOG=${OUT:-/tmp}/gpu-offload.log
B=.devbin
GPT=gpt:vocab=50304,d_model=2048,layers=24,heads=16,d_ff=8192,seq=1024,batch=8
main() {
date -u
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv
echo "== test cuda_offload"
INGOT_REQUIRE_GPU=1 timeout 60 $B/test_cuda_offload --test-threads=1 --nocapture
echo "test rc $?"
for run in 16GiB:95 24GiB:70; do
  budget=${run%%:*}
  echo "== train $GPT --budget $budget"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > /tmp/smi-$budget &
  smi=$!
  SECONDS=0
  timeout ${run##*:} $B/ingot train --model $GPT --device cuda --precision bf16 \
    --optimizer adamw --budget $budget --steps 5 --json > /tmp/run-$budget.json
  echo "train rc $? wall ${SECONDS} s"
  kill $smi
  grep -v '"loss"' /tmp/run-$budget.json | cut -c1-3000
  grep '"loss"' /tmp/run-$budget.json | cut -c1-300
  python3 $B/summ.py < /tmp/run-$budget.json
  echo "nvidia-smi peak memory.used MiB: $(sort -n /tmp/smi-$budget | tail -1)"
done
date -u
}
main 2>&1 | tee "$LOG"
