#!/bin/bash
# Session 44, helper F (issue 48/51): resnet50 224 b128 bf16 fitted to 0.75x torch.compile's
# peak (4,397,284,992 B), OLD (main at the session's start) against NEW (branch s44-f, the
# ReLU masks recomputed from their outputs as the fitter's cheapest candidates), on one H200.
# Each binary's fitted executable was compiled on the 2-core machine (`ingot compile ...
# --budget 4397284992 -o E`); the unfitted step by `ingot train` here. Alternated O N O N,
# two rounds: median step, planned and measured bytes, last loss. Then, if time is left,
# torchvision + torch.compile's step and peak (scripts/resnet_beside_torch.py).
# usage: bash .device-bin/f/gpu-s44-f-script.sh  (with .device-bin/f/f.txz carried)
X=/tmp/s44f; . scripts/device_prelude.sh
END=${END:-165}
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .device-bin/f/f.txz $X
O=$X/old; N=$X/new
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
run() { # label, timeout, binary, args...: one summary line
  local l=$1 s=$2 b=$3; shift 3
  echo -n "$l: "; timeout $s $b "$@" 2>$X/run.err | python3 scripts/summ.py || tail -3 $X/run.err
}
R50="--model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json"
for round in 1 2; do
  echo "== round $round"
  for b in O N; do eval B=\$$b
    run "unfitted $b" 40 $B/ingot train $R50
  done
  for b in O N; do eval B=\$$b
    run "fitted-4397284992 $b" 40 $B/ingot run $B/fit.ingot --device cuda --steps 10 --json
  done
  t
done
L=$(left $END)
echo "== torch.compile (channels_last), $L s left"
[ "$L" -gt 40 ] && timeout $((L-5)) python3 scripts/resnet_beside_torch.py --depth 50 --side 224 --batch 128 --precision bf16 2>&1 | tail -3
t; echo done
