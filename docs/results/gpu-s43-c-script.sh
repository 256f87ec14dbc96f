#!/bin/bash
# Session 43, helper C (one H200), issue 48: resnet50's stem channels-last (a large bf16
# convolution over few channels goes NHWC; its batch norm, ReLU and max pooling with it).
# NEW = s43-c; OLD = main's binary at the session's start (/tmp/s43-old).
#  1. resnet50 224 b128 bf16, `ingot train --steps 10 --json`, NEW and OLD alternating, two
#     rounds (median step, planned / measured bytes, losses); NEW's runs with INGOT_LOG=1
#     (the stem's cuDNN choice and workspace).
#  2. resnet18 (CIFAR) and cnn bf16, 30 steps, alternating, two rounds.
#  3. GPU tests (NEW), INGOT_REQUIRE_GPU=1: trainer cuda_channels_last, cuda_conv, cuda_cudnn.
#  4. cuda_profile resnet50 NEW (the stem's rows).
# usage: bash .device-bin/c/gpu-s43-c-script.sh (bins.tar.xz and device_prelude.sh beside it)
D=.device-bin/c
X=/tmp/c; source $D/device_prelude.sh
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
for r in 1 2; do INGOT_LOG=1 train N r5$r 50 $M 10; train O r5$r 50 $M 10; t; done
same N_r51 N_r52; same O_r51 O_r52
echo "-- NEW's INGOT_LOG, the stem's passes (3 input channels) and the poolings"
grep -iE "in_ch: 3|\[128, 3, 224, 224\]|\[128, 224, 224, 3\]|channels-last|few" $X/t_N_r51.err | head -12 | cut -c1-400
grep -ciE "cudnn" $X/t_N_r51.err
cp $X/t_N_r51.err $OUT/ingot-log-new-resnet50.txt
echo "== 2. resnet18 and cnn bf16 30 steps, NEW/OLD alternating"
for m in resnet18 cnn; do for r in 1 2; do train N $m$r 30 $m 30; train O $m$r 30 $m 30; done; same N_${m}1 O_${m}1; t; done
echo "== 3. GPU tests (NEW)"
for tb in cuda_channels_last cuda_conv cuda_cudnn; do
  [ $(left 195) -gt 45 ] || { echo "$tb: not run (time)"; continue; }
  INGOT_REQUIRE_GPU=1 timeout $(( $(left 195) - 40 )) $N/$tb --test-threads=1 > $X/$tb.txt 2>&1; echo "$tb rc=$?"
  grep -E "^test |test result|panicked" $X/$tb.txt | head -12; cp $X/$tb.txt $OUT/; t
done
echo "== 4. cuda_profile resnet50 NEW"
[ $(left 195) -gt 30 ] && { timeout $(( $(left 195) - 3 )) $N/cuda_profile $M --precision bf16 --top 40 > $X/prof_new.txt 2>&1; echo "rc=$?"; cp $X/prof_new.txt $OUT/; head -6 $X/prof_new.txt | cut -c1-200; grep -E "in_ch: 3,|max_pool|112, 112" $X/prof_new.txt | cut -c1-300; t; }
t; echo done
