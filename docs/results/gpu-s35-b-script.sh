#!/bin/bash
# Session 35, helper B (issue 49): CPU steps on the GPU machine's host, 16 threads, OLD/NEW.
# NEW: s35-b (batch norms' reductions over [0, 2, 3] compiled and cut into channels);
# OLD: main before this session (/tmp/s35-old/ingot). One device call, under 200 s:
#  1. scripts/cpu_bench.py --threads 16, Ingot NEW, OLD, NEW alternating (cnn resnet18 mlp
#     gpt-mini, default steps); 2. PyTorch eager on the same models; 3. torch.compile, as time
#     allows.
# usage: bash .device-bin/b/gpu-s35-b-script.sh  (with .device-bin/b/{new,old}/ingot carried)
START=$(date +%s)
OUT=${OUT:-/tmp/s35b-out}; mkdir -p $OUT
X=/tmp/s35baux; mkdir -p $X  # only the log comes back
exec > >(tee -a $OUT/gpu-s35-b-log.txt) 2>&1
D=$(dirname "$0")
t() { echo "[t=$(( $(date +%s) - START )) s]"; }
left() { echo $(( ${1:-190} - $(date +%s) + START )); }
export PYTHONUNBUFFERED=1
nproc; uptime; lscpu | grep -E "Model name|^CPU\(s\)" ; python3 -c "import torch; print('torch', torch.__version__)"
gunzip -f $D/new/ingot.gz $D/old/ingot.gz 2>/dev/null; chmod +x $D/new/ingot $D/old/ingot
M="cnn resnet18 mlp gpt-mini"
run() { # $1 label, $2 bin, $3 systems, $4 models
  [ $(left) -gt 15 ] || { echo "== $1: not run (time)"; return; }
  echo "== $1"
  BIN=$2 timeout $(left) python3 scripts/cpu_bench.py --threads 16 --models $4 --systems $3 --timeout 60 2>$X/err.txt
  grep -iE "error|fail|timeout" $X/err.txt | head -5; t
}
run "NEW ingot" $D/new/ingot ingot "$M"
run "OLD ingot" $D/old/ingot ingot "$M"
run "PyTorch eager" $D/new/ingot torch-eager "$M"
run "NEW ingot (again)" $D/new/ingot ingot "cnn resnet18"
run "torch.compile" $D/new/ingot torch-compile "cnn resnet18 mlp"
echo done; t
