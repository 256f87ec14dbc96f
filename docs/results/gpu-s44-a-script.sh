#!/bin/bash
# Session 44, helper A (one H200), issue 48: a sum that reads a sum taken apart into first-stage
# sums (kernels/src/fused/distribute.rs), so the batch norms' backward chains on the GPU run one
# stage (partial, finish, dx) where they ran two (a second partial re-reading every input).
# NEW = s44-a; OLD = main's binary at the session's start (/tmp/s44-old).
#  1. resnet50 224 bf16 b128, `ingot train --steps 10 --json`, NEW and OLD alternating, two
#     rounds (median step, planned / measured bytes, the losses).
#  2. resnet18 (CIFAR) bf16 30 steps, alternating, two rounds.
#  3. cuda_kernels (NEW) --precision bf16 --channels-last resnet:depth=50,side=56,batch=16:
#     every distinct kernel against the CPU on the GPU.
#  4. GPU tests (NEW): trainer's cuda_channels_last, cuda_conv.
#  5. If time is left: cuda_profile resnet50 NEW and OLD (fused kernels' total).
# usage: bash .device-bin/a/gpu-s44-a-script.sh (bins.tar.xz and device_prelude.sh beside it).
D=.device-bin/a
X=/tmp/a; source $D/device_prelude.sh
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
N=$X/new; O=$X/old; chmod +x $N/* $O/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; t
M=resnet:depth=50,side=224,batch=128
END=${END:-192}
train() { eval B=\$$1; local l=$1 r=$2 to=$3 m=$4 s=$5; shift 5; echo "-- $m $l round $r $*"
  timeout $to $B/ingot train --model $m --device cuda --precision bf16 --steps $s --json "$@" > $X/t_${l}_$r.json 2> $X/t_${l}_$r.err; echo "rc=$?"
  cp $X/t_${l}_$r.json $OUT/ 2>/dev/null
  python3 scripts/summ.py < $X/t_${l}_$r.json || tail -3 $X/t_${l}_$r.err
  grep -o '"loss":[^,]*' $X/t_${l}_$r.json | tr '\n' ' '; echo; }
same() { cmp -s <(grep -o '"loss":[^,]*' $X/t_$1.json) <(grep -o '"loss":[^,]*' $X/t_$2.json) && echo "losses $1 = $2 (bit for bit as printed)" || echo "losses $1 != $2"; }
echo "== 1. resnet50 224 bf16 b128, NEW/OLD alternating"
for r in 1 2; do train N r5$r 45 $M 10; train O r5$r 45 $M 10; t; done
same N_r51 O_r51; same N_r51 N_r52; same O_r51 O_r52
echo "== 2. resnet18 bf16 30 steps, NEW/OLD alternating"
for r in 1 2; do train N r18$r 20 resnet18 30; train O r18$r 20 resnet18 30; t; done
same N_r181 O_r181; same N_r181 N_r182; same O_r181 O_r182
echo "== 3. cuda_kernels NEW resnet50 side 56 batch 16 bf16 channels-last"
[ $(left $END) -gt 40 ] && { INGOT_REQUIRE_GPU=1 timeout 35 $N/cuda_kernels --precision bf16 --channels-last resnet:depth=50,side=56,batch=16 > $X/kernels.txt 2>&1; echo "rc=$?"
  cp $X/kernels.txt $OUT/; echo "ok: $(grep -c '^ok' $X/kernels.txt)"; grep "^FAIL" $X/kernels.txt | cut -c1-300; tail -3 $X/kernels.txt | cut -c1-300; t; }
echo "== 4. GPU tests (NEW)"
for tb in cuda_channels_last cuda_conv; do
  [ $(left $END) -gt 25 ] || { echo "$tb: not run (time)"; continue; }
  INGOT_REQUIRE_GPU=1 timeout $(( $(left $END) - 5 )) $N/$tb --test-threads=1 > $X/$tb.txt 2>&1; echo "$tb rc=$?"
  grep -E "^test |test result|panicked" $X/$tb.txt | head -12; t
done
echo "== 5. cuda_profile resnet50 NEW, OLD"
for b in N O; do eval B=\$$b
  [ $(left $END) -gt 35 ] || { echo "profile $b: not run (time)"; continue; }
  timeout $(( $(left $END) - 3 )) $B/cuda_profile $M --precision bf16 --top 30 > $X/prof_$b.txt 2>&1; echo "profile $b rc=$?"
  cp $X/prof_$b.txt $OUT/; head -6 $X/prof_$b.txt | cut -c1-200; t
done
t; echo done
