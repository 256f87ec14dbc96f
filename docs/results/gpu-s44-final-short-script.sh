#!/bin/bash
# Session 44, the lead's final call, shortened to the session's last minutes: resnet50 224 b128
# bf16 OLD (58aa6b4) and NEW (the merged tree), NEW fitted to 0.75x torch.compile's peak of
# session 43 (--budget 4397284992, compiled on the 2-core machine), and the 1.3B GPT at 16 GiB.
# usage: bash docs/results/gpu-s44-final-short-script.sh  (.device-bin/final/final.txz)
X=/tmp/s44f; . scripts/device_prelude.sh
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .device-bin/final/final.txz $X
N=$X/new; O=$X/old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; t
run() { local l=$1 s=$2 b=$3; shift 3
  echo -n "$l: "; timeout $s $b "$@" 2>$X/run.err | python3 scripts/summ.py || tail -3 $X/run.err; }
R50="--model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json"
for r in 1 2; do
  run "resnet50 O" 60 $O/ingot train $R50
  run "resnet50 N" 60 $N/ingot train $R50
  run "resnet50@4397284992 N" 60 $N/ingot run $N/r50f.ingot --device cuda --steps 10 --json
done; t
run "gpt13@16GiB N" 90 $N/ingot run $N/gpt13-16.ingot --device cuda --steps 5 --json
t; echo done
