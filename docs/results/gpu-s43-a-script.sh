#!/bin/bash
# Session 43, helper A (one H200), issue 48: a channels-last batch norm's weight and bias
# gradient sums folded into its data gradient's kernel (compiler/src/fuse/merge/rules.rs):
# no f32 dy stored for a kernel of their own, no second read of x.
# NEW = s43-a; OLD = main's binary at the session's start (/tmp/s43-old).
#  1. resnet50 224 bf16 b128, `ingot train --steps 10 --json`, NEW and OLD alternating, two
#     rounds (median step, planned / measured bytes, the losses).
#  2. resnet18 (CIFAR) bf16 30 steps, alternating, two rounds.
#  3. cuda_profile resnet50 NEW (fused total against OLD's 22.4 ms).
#  4. cuda_kernels (NEW) --precision bf16 --channels-last resnet:depth=50,side=56,batch=16:
#     every distinct kernel against the CPU on the GPU.
#  5. GPU test: trainer's cuda_channels_last (resnet18 channels-last, GPU against CPU).
# usage: bash .device-bin/a/gpu-s43-a-script.sh (bins.tar.xz and device_prelude.sh beside it).
D=.device-bin/a
X=/tmp/a; source $D/device_prelude.sh
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
N=$X/new; O=$X/old; chmod +x $N/* $O/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; t
M=resnet:depth=50,side=224,batch=128
train() { eval B=\$$1; local l=$1 r=$2 to=$3 m=$4 s=$5; shift 5; echo "-- $m $l round $r $*"
  timeout $to $B/ingot train --model $m --device cuda --precision bf16 --steps $s --json "$@" > $X/t_${l}_$r.json 2> $X/t_${l}_$r.err; echo "rc=$?"
  python3 scripts/summ.py < $X/t_${l}_$r.json || tail -3 $X/t_${l}_$r.err
  grep -o '"loss":[^,]*' $X/t_${l}_$r.json | tr '\n' ' '; echo; }
same() { cmp -s <(grep -o '"loss":[^,]*' $X/t_$1.json) <(grep -o '"loss":[^,]*' $X/t_$2.json) && echo "losses $1 = $2 (bit for bit as printed)" || echo "losses $1 != $2"; }
echo "== 1. resnet50 224 bf16 b128, NEW/OLD alternating"
for r in 1 2; do train N r5$r 45 $M 10; train O r5$r 45 $M 10; t; done
same N_r51 O_r51; same N_r51 N_r52; same O_r51 O_r52
echo "== 2. resnet18 bf16 30 steps, NEW/OLD alternating"
for r in 1 2; do train N r18$r 20 resnet18 30; train O r18$r 20 resnet18 30; t; done
same N_r181 O_r181; same N_r181 N_r182
echo "== 3. cuda_profile resnet50 NEW"
[ $(left 195) -gt 60 ] && { timeout 40 $N/cuda_profile $M --precision bf16 --top 40 > $X/prof_new.txt 2>&1; echo "rc=$?"; cp $X/prof_new.txt $OUT/; head -6 $X/prof_new.txt | cut -c1-200; t; }
echo "== 4. cuda_kernels NEW resnet50 side 56 batch 16 bf16 channels-last"
[ $(left 195) -gt 45 ] && { INGOT_REQUIRE_GPU=1 timeout 35 $N/cuda_kernels --precision bf16 --channels-last resnet:depth=50,side=56,batch=16 > $X/kernels.txt 2>&1; echo "rc=$?"
  cp $X/kernels.txt $OUT/; echo "ok: $(grep -c '^ok' $X/kernels.txt)"; grep "^FAIL" $X/kernels.txt | cut -c1-300; tail -3 $X/kernels.txt | cut -c1-300; t; }
echo "== 5. GPU test: trainer cuda_channels_last (NEW)"
[ $(left 195) -gt 25 ] && { INGOT_REQUIRE_GPU=1 timeout $(( $(left 195) - 5 )) $N/cuda_channels_last --test-threads=1 > $X/cl.txt 2>&1; echo "cuda_channels_last rc=$?"; grep -E "^test |test result|panicked" $X/cl.txt | head -12; t; }
t; echo done
