#!/bin/bash
# Session 42, helper A (one H200), issues 48 and 52: column reductions whose partial kernel
# left SMs idle split more ways (kernels/src/cuda/fused/split.rs `filled`), and each
# fused kernel's bytes and GB/s in cuda_profile.
# NEW = s42-a; OLD = main's binary at the session's start (/tmp/s42-old).
#  1. resnet50 224 bf16 b128, `ingot train --steps 10 --json`, NEW and OLD alternating, two
#     rounds (median step, planned / measured bytes, the losses).
#  2. gpt2 bf16 SGD lr 0.01 20 steps and resnet18 (CIFAR) bf16 30 steps, alternating, two rounds.
#  3. cuda_kernels (NEW) on resnet50 at side 56 batch 128, bf16 channels-last: its 14x14x256
#     and 7x7x512 batch norms are the shapes the change splits more ways; every distinct
#     kernel against the CPU on the GPU, timed.
#  4. cuda_profile resnet50 (NEW), and NEW's cuda_profile of OLD's compiled step (bytes, GB/s).
#  5. GPU test: trainer's cuda_channels_last (resnet18 CIFAR, whose 8x8x256 backward changes).
# usage: bash .device-bin/a/gpu-s42-a-script.sh (bins.tar.xz and device_prelude.sh beside it).
D=.device-bin/a
X=/tmp/a; source $D/device_prelude.sh
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
N=$X/new; O=$X/old; chmod +x $N/* $O/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u; t
M=resnet:depth=50,side=224,batch=128
# train LABEL ROUND TIMEOUT MODEL STEPS [FLAGS...]
train() { eval B=\$$1; local l=$1 r=$2 to=$3 m=$4 s=$5; shift 5; echo "-- $m $l round $r $*"
  timeout $to $B/ingot train --model $m --device cuda --precision bf16 --steps $s --json "$@" > $X/t_${l}_$r.json 2> $X/t_${l}_$r.err; echo "rc=$?"
  python3 scripts/summ.py < $X/t_${l}_$r.json || tail -3 $X/t_${l}_$r.err
  grep -o '"loss":[^,]*' $X/t_${l}_$r.json | tr '\n' ' '; echo; }
same() { cmp -s <(grep -o '"loss":[^,]*' $X/t_$1.json) <(grep -o '"loss":[^,]*' $X/t_$2.json) && echo "losses $1 = $2 (bit for bit as printed)" || echo "losses $1 != $2"; }
echo "== 1. resnet50 224 bf16 b128, NEW/OLD alternating"
for r in 1 2; do train N r5$r 60 $M 10; train O r5$r 60 $M 10; t; done
same N_r51 O_r51; same N_r51 N_r52; same O_r51 O_r52
echo "== 2. gpt2 bf16 SGD lr 0.01 20 steps, NEW/OLD alternating"
for r in 1 2; do train N g$r 40 gpt2 20 --optimizer sgd --lr 0.01; train O g$r 40 gpt2 20 --optimizer sgd --lr 0.01; t; done
same N_g1 O_g1; same N_g1 N_g2
echo "== 2b. resnet18 bf16 30 steps, NEW/OLD alternating"
for r in 1 2; do train N r18$r 30 resnet18 30; train O r18$r 30 resnet18 30; t; done
same N_r181 O_r181; same N_r181 N_r182
echo "== 3. cuda_kernels NEW resnet50 side 56 batch 128 bf16 channels-last"
[ $(left 235) -gt 60 ] && { INGOT_REQUIRE_GPU=1 timeout 50 $N/cuda_kernels --precision bf16 --channels-last resnet:depth=50,side=56,batch=128 > $X/kernels.txt 2>&1; echo "rc=$?"
  cp $X/kernels.txt $OUT/; grep -c "^ok" $X/kernels.txt; grep "^FAIL" $X/kernels.txt | cut -c1-300
  grep -E "domain \[128, (14, 14, 256|7, 7, 512)\] reduce \[0, 1, 2\]" $X/kernels.txt | cut -c1-260; t; }
echo "== 4. cuda_profile resnet50 NEW"
[ $(left 235) -gt 45 ] && { timeout 45 $N/cuda_profile $M --precision bf16 --top 40 > $X/prof_new.txt 2>&1; echo "rc=$?"; cp $X/prof_new.txt $OUT/; head -6 $X/prof_new.txt | cut -c1-200; grep -E "\[128, (14, 14, 256|7, 7, 512)\] reduce \[0, 1, 2\] in 9" $X/prof_new.txt; t; }
echo "== 5. GPU test: trainer cuda_channels_last (NEW)"
[ $(left 235) -gt 40 ] && { INGOT_REQUIRE_GPU=1 timeout $(( $(left 235) - 30 )) $N/cuda_channels_last --test-threads=1 > $X/cl.txt 2>&1; echo "cuda_channels_last rc=$?"; grep -E "^test |test result|panicked" $X/cl.txt | head -12; t; }
echo "== 4b. NEW's cuda_profile of OLD's compiled resnet50 step"
[ $(left 235) -gt 40 ] && { timeout 20 $O/ingot compile --model $M --device cuda --precision bf16 -o $X/old.exe > /dev/null 2>&1; echo "compile rc=$?"
  timeout $(( $(left 235) - 3 )) $N/cuda_profile $X/old.exe --top 40 > $X/prof_old.txt 2>&1; echo "rc=$?"; cp $X/prof_old.txt $OUT/; head -6 $X/prof_old.txt | cut -c1-200; grep -E "\[128, (14, 14, 256|7, 7, 512)\] reduce \[0, 1, 2\] in 9" $X/prof_old.txt; t; }
t; echo done
