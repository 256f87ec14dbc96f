#!/bin/bash
# Session 44, helper D (issue 49): resnet18's and cnn's fused kernels on the GPU machine's
# host, 16 threads, OLD/NEW. NEW: s44-d (batch norms across the channels read their
# per-channel operands from lanes spread once a group; rows' bases without divisions; pieces
# of fewer elements for long bodies; the profile summed by kind); OLD: main at the session's
# start. One device call under 130 s: fused_probe (every distinct fused kernel of resnet18
# and cnn alone, one thread and cut for 16 as the runtime cuts them) OLD, NEW, OLD, NEW;
# losses (resnet18 NEW on 16 / 2 / 1 threads and OLD on 16; cnn NEW and OLD);
# scripts/cpu_bench.py --threads 16 for cnn and resnet18: NEW, OLD, PyTorch eager, OLD, NEW;
# per-op profiles of resnet18 NEW, OLD, NEW (every row summed by kind in NEW's).
# usage: bash .device-bin/d/script.sh  (with .device-bin/d/bins.tar.xz: new/ingot,
# new/fused_probe, old/ingot, old/fused_probe, resnet18.json, cnn.json)
X=/tmp/d; source "$(dirname "$0")/device_prelude.sh"
D=$(dirname "$0")
END=${END:-122}
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
  [ "$(left $END)" -gt 15 ] || { echo "== profile $1 $3: not run (time)"; return; }
  echo "== profile $1: $3, $TH threads, $4 steps"
  INGOT_CPU_PROFILE=1 timeout 20 $2 train --model $3 --device cpu --threads $TH --steps $4 > $OUT/profile-$1-$3.txt 2>&1
  grep -E "^step|median|CPU step profile" $OUT/profile-$1-$3.txt; sed -n '/kind (all/,$p' $OUT/profile-$1-$3.txt; t
}
probe() { # $1 label, $2 dir
  for m in resnet18 cnn; do
    [ "$(left $END)" -gt 20 ] || { echo "== fused_probe $1 $m: not run (time)"; continue; }
    local rule=16384; [ "$1" = NEW ] && rule=work
    timeout 20 $X/b/$2/fused_probe $D/$m.json $TH 5 $rule > $OUT/fused-probe-$1-$m-$3.txt 2>&1
    echo "fused_probe $1 $m: $(tail -n 1 $OUT/fused-probe-$1-$m-$3.txt)"
  done; t
}
echo "== fused kernels alone (fused_probe), $TH threads"
probe OLD old 1; probe NEW new 1; probe OLD old 2; probe NEW new 2
head -16 $OUT/fused-probe-NEW-resnet18-2.txt | cut -c1-160
echo "== losses, 3 steps"
losses() { timeout 25 $1 train --model $2 --device cpu --threads $3 --steps 3 --json 2>/dev/null | grep -o '"loss":[^,]*' | tr '\n' ' '; }
for th in $TH 2; do echo "resnet18 NEW threads $th: $(losses $NEW resnet18 $th)"; done
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
prof NEW2 $NEW resnet18 3
prof NEW $NEW cnn 5
prof OLD $OLD cnn 5
echo "resnet18 NEW threads 1: $(losses $NEW resnet18 1)"
echo done; t
