#!/bin/bash
# Session 39, helper D (issue 49): CPU steps on the GPU machine's host, 16 threads, OLD/NEW.
# NEW: s39-d (small-image convolutions in blocks of a GEMM panel's width, 1,024 columns, held
# by the least workspace; one-pixel ones in one GEMM over the batch); OLD: main at the
# session's start (/tmp/s39-old/ingot).
# One device call, under 170 s: scripts/cpu_bench.py --threads 16: Ingot NEW, OLD, the
# per-op profiles of resnet18 and cnn (NEW), PyTorch eager, NEW and OLD again, then torch.compile for
# cnn and resnet18 with what is left (its first warm-up step compiles).
# usage: bash .device-bin/d/script.sh  (with .device-bin/d/bins.tar.xz carried: new/ingot, old/ingot)
X=/tmp/d; source scripts/device_prelude.sh
D=$(dirname "$0")
nproc; uptime; lscpu | grep -E "Model name|^CPU\(s\)"; python3 -c "import torch; print('torch', torch.__version__)"
echo "g++: $(which g++ || echo MISSING)"
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X/b')"; chmod +x $X/b/new/ingot $X/b/old/ingot
NEW=$X/b/new/ingot; OLD=$X/b/old/ingot
M="mlp gpt-mini cnn resnet18"
run() { # $1 label, $2 bin, $3 systems, $4 models
  [ "$(left 166)" -gt 12 ] || { echo "== $1: not run (time)"; return; }
  echo "== $1"
  BIN=$2 timeout "$(left 166)" python3 scripts/cpu_bench.py --threads 16 --models $4 --systems $3 --timeout "$(( $(left 166) - 5 ))" 2>$X/err.txt
  grep -iE "error|fail|timeout" $X/err.txt | head -5; t
}
prof() { # $1 label, $2 bin, $3 model, $4 steps
  echo "== profile $1: $3, 16 threads, $4 steps"
  INGOT_CPU_PROFILE=1 timeout 30 $2 train --model $3 --device cpu --threads 16 --steps $4 2>&1 | grep -vE "^ +[0-9.]+ +0\.[0-9]%" | head -40; t
}
run "NEW ingot" $NEW ingot "$M"
run "OLD ingot" $OLD ingot "$M"
prof NEW $NEW resnet18 3
prof NEW $NEW cnn 5
run "PyTorch eager" $NEW torch-eager "$M"
run "NEW ingot (again)" $NEW ingot "cnn resnet18"
run "OLD ingot (again)" $OLD ingot "cnn resnet18"
run "torch.compile cnn" $NEW torch-compile cnn
run "torch.compile resnet18" $NEW torch-compile resnet18
cat $X/err.txt | tail -5
echo done; t
