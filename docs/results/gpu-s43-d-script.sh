#!/bin/bash
# Session 43, helper D (issue 49): CPU steps on the GPU machine's host, 16 threads, OLD/NEW.
# NEW: s43-d (the forward and input gradient of small images in tiles of images (and input
# channels), each tile's GEMM and col2im on one thread); OLD: main at the session's start.
# One device call under 160 s: NEW's conv_speed (each pass against its bare GEMM; the input
# gradients' GEMMs in blocks and in tiles), losses (resnet18 NEW on 16 / 2 / 1 threads and OLD
# on 16; cnn NEW and OLD), scripts/cpu_bench.py --threads 16 for cnn and resnet18: NEW, OLD,
# PyTorch eager, OLD, NEW, per-op profiles (NEW, OLD), then torch.compile resnet18 and cnn with
# what is left.
# usage: bash .device-bin/d/script.sh  (with .device-bin/d/bins.tar.xz: new/ingot,
# new/conv_speed, old/ingot)
X=/tmp/d; source "$(dirname "$0")/device_prelude.sh"
D=$(dirname "$0")
END=${END:-155}
nproc; uptime; lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core" | cut -c1-200; python3 -c "import torch; print('torch', torch.__version__)"
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X/b')"; chmod +x $X/b/new/* $X/b/old/*
NEW=$X/b/new/ingot; OLD=$X/b/old/ingot
M="cnn resnet18"
TH=${TH:-16}
run() { # $1 label, $2 bin, $3 systems, $4 models
  [ "$(left $END)" -gt 12 ] || { echo "== $1: not run (time)"; return; }
  echo "== $1"
  BIN=$2 timeout "$(left $END)" python3 scripts/cpu_bench.py --threads $TH --models $4 --systems $3 --timeout "$(( $(left $END) - 5 ))" 2>$X/err.txt
  grep -iE "error|fail|timeout" $X/err.txt | head -5; t
}
prof() { # $1 label, $2 bin, $3 model, $4 steps
  [ "$(left $END)" -gt 25 ] || { echo "== profile $1 $3: not run (time)"; return; }
  echo "== profile $1: $3, $TH threads, $4 steps"
  INGOT_CPU_PROFILE=1 timeout 20 $2 train --model $3 --device cpu --threads $TH --steps $4 2>&1 | grep -vE "^ +[0-9.]+ +0\.[0-9]%" | head -34; t
}
losses() { timeout 40 $1 train --model $2 --device cpu --threads $3 --steps 3 --json 2>/dev/null | grep -o '"loss":[^,]*' | tr '\n' ' '; }
echo "== conv_speed (NEW), $TH threads"; timeout 40 $X/b/new/conv_speed $TH; t
echo "== losses, 3 steps"
for th in $TH 2 1; do echo "resnet18 NEW threads $th: $(losses $NEW resnet18 $th)"; done
echo "resnet18 OLD threads $TH: $(losses $OLD resnet18 $TH)"
echo "cnn NEW threads $TH: $(losses $NEW cnn $TH)"
echo "cnn OLD threads $TH: $(losses $OLD cnn $TH)"; t
run "NEW ingot" $NEW ingot "$M"
run "OLD ingot" $OLD ingot "$M"
run "PyTorch eager" $NEW torch-eager "$M"
run "OLD ingot (again)" $OLD ingot "$M"
run "NEW ingot (again)" $NEW ingot "$M"
prof NEW $NEW resnet18 3
prof OLD $OLD resnet18 3
run "torch.compile resnet18" $NEW torch-compile resnet18
run "torch.compile cnn" $NEW torch-compile cnn
echo done; t
