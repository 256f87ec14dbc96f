#!/bin/bash
# Session 37, helper D (issue 49): CPU steps on the GPU machine's host, 16 threads, OLD/NEW.
# NEW: s37-d (fused lane loops and attention on the widest vectors, attention's backward on
# the transposed-keys path, GEMM panels threaded with two waits a panel); OLD: main at the
# session's start (/tmp/s37-old/ingot). One device call, under 170 s:
#  scripts/cpu_bench.py --threads 16, eager only: Ingot NEW, OLD, PyTorch eager, NEW again.
# usage: bash .device-bin/d/gpu-s37-d-script.sh  (with .device-bin/d/{new,old}/ingot.gz carried)
X=/tmp/d; source scripts/device_prelude.sh
D=$(dirname "$0")
nproc; uptime; lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-200; python3 -c "import torch; print('torch', torch.__version__)"
gunzip -f $D/new/ingot.gz $D/old/ingot.gz 2>/dev/null; chmod +x $D/new/ingot $D/old/ingot
M="mlp gpt-mini cnn resnet18"
run() { # $1 label, $2 bin, $3 systems, $4 models
  [ "$(left 165)" -gt 15 ] || { echo "== $1: not run (time)"; return; }
  echo "== $1"
  BIN=$2 timeout "$(left 165)" python3 scripts/cpu_bench.py --threads 16 --models $4 --systems $3 --timeout 60 2>$X/err.txt
  grep -iE "error|fail|timeout" $X/err.txt | head -5; t
}
run "NEW ingot" $D/new/ingot ingot "$M"
run "OLD ingot" $D/old/ingot ingot "$M"
run "PyTorch eager" $D/new/ingot torch-eager "$M"
run "NEW ingot (again)" $D/new/ingot ingot "$M"
run "OLD ingot (again)" $D/old/ingot ingot "mlp gpt-mini"
echo done; t
