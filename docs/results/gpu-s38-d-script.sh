#!/bin/bash
# Session 38, helper D (issue 49): CPU steps on the GPU machine's host, 16 threads, OLD/NEW.
# NEW: s38-d (one-pixel convolutions through their live tap, the halving max pooling's
# gradient in one wide pass); OLD: main at the session's start (/tmp/s38-old/ingot).
# One device call, under 170 s: scripts/cpu_bench.py --threads 16: Ingot NEW, OLD, the
# per-op profile of resnet18 (NEW, OLD), PyTorch eager, NEW and OLD again, torch.compile.
# usage: bash .device-bin/d/script.sh  (with .device-bin/d/bins.tar.xz carried: new/ingot, old/ingot)
X=/tmp/d; source scripts/device_prelude.sh
D=$(dirname "$0")
nproc; uptime; lscpu | grep -E "Model name|^CPU\(s\)" ; python3 -c "import torch; print('torch', torch.__version__)"
echo "g++: $(which g++ || echo MISSING)"; echo "cc: $(which cc gcc clang 2>/dev/null | tr '\n' ' ')"
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X/b')"; chmod +x $X/b/new/ingot $X/b/old/ingot
NEW=$X/b/new/ingot; OLD=$X/b/old/ingot
M="mlp gpt-mini cnn resnet18"
run() { # $1 label, $2 bin, $3 systems, $4 models
  [ "$(left 165)" -gt 12 ] || { echo "== $1: not run (time)"; return; }
  echo "== $1"
  BIN=$2 timeout "$(left 165)" python3 scripts/cpu_bench.py --threads 16 --models $4 --systems $3 --timeout "$(left 165)" 2>$X/err.txt
  grep -iE "error|fail|timeout" $X/err.txt | head -5; t
}
prof() { # $1 label, $2 bin
  echo "== profile $1: resnet18, 16 threads, 3 steps"
  INGOT_CPU_PROFILE=1 timeout 30 $2 train --model resnet18 --device cpu --threads 16 --steps 3 2>&1 | grep -vE "^ +[0-9.]+ +0\.[0-9]%" | head -45; t
}
run "NEW ingot" $NEW ingot "$M"
run "OLD ingot" $OLD ingot "$M"
prof NEW $NEW
prof OLD $OLD
run "PyTorch eager" $NEW torch-eager "$M"
run "NEW ingot (again)" $NEW ingot "$M"
run "OLD ingot (again)" $OLD ingot "cnn resnet18"
run "torch.compile" $NEW torch-compile "mlp cnn resnet18 gpt-mini"
echo done; t
