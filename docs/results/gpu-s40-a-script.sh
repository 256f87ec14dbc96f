#!/bin/bash
# Session 40, helper A (one H200), issue 48: the default route per convolution. NEW = s40-a (an
# NCHW bf16 convolution over fewer than 8 input channels whose planned workspace holds
# cudnn_few_channel_room runs through cuDNN by default: Conv::default_route); OLD = main's
# binary at the session's start (e70d03a).
#  1. resnet50 224 bf16 b128, default routes, `ingot train --steps 10 --json`, NEW and OLD
#     alternating, two rounds; NEW's first run prints its convolutions' choices (INGOT_LOG).
#  2. OLD under INGOT_CONV=cudnn (the same routes as NEW's default): its losses against NEW's.
#  3. resnet18 (CIFAR) and cnn bf16 default, 30 steps, NEW and OLD alternating, two rounds.
#  4. NEW's cuda_profile of resnet50 (default routes), top 30.
# (No GPU test binaries: they did not build in time on the loaded 2-core machine.)
# usage: bash .device-bin/a/gpu-s40-a-script.sh (bins.tar.xz and device_prelude.sh beside it).
D=.device-bin/a
X=/tmp/a; source $D/device_prelude.sh
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
N=$X/new; O=$X/old; chmod +x $N/* $O/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
M=resnet:depth=50,side=224,batch=128
# train LABEL ROUND TIMEOUT MODEL STEPS [ENV...]
train() { eval B=\$$1; local l=$1 r=$2 to=$3 m=$4 s=$5; shift 5; echo "-- $m $l round $r $*"
  env "$@" timeout $to $B/ingot train --model $m --device cuda --precision bf16 --steps $s --json > $X/t.json 2> $X/t_${l}_$r.err; echo "rc=$?"
  python3 scripts/summ.py < $X/t.json || tail -3 $X/t_${l}_$r.err
  python3 -c "import json,sys; L=[json.loads(l) for l in open('$X/t.json') if l.startswith('{')]; print('losses', [x.get('loss') for x in L if 'loss' in x][:12])" 2>/dev/null; }
echo "== resnet50 224 bf16 b128, default routes, NEW/OLD alternating"
train N 1 60 $M 10 INGOT_LOG=1; grep "^step: conv" $X/t_N_1.err | head -3; t
train O 1 40 $M 10 INGOT_LOG=1; grep "^step: conv" $X/t_O_1.err | head -3; t
train N 2 30 $M 10; t
train O 2 30 $M 10; t
echo "== OLD under INGOT_CONV=cudnn (NEW's default routes)"
train O c 30 $M 10 INGOT_CONV=cudnn; t
for m in resnet18 cnn; do
  echo "== $m bf16 default, 30 steps, NEW/OLD alternating"
  for r in 1 2; do [ $(left 240) -gt 150 ] && { train N $r 25 $m 30 INGOT_LOG=1; grep "^step: conv" $X/t_N_$r.err | head -2; train O $r 25 $m 30; t; }; done
done
echo "== NEW cuda_profile resnet50, default routes"
[ $(left 285) -gt 40 ] && { timeout $(( $(left 285) - 5 )) $N/cuda_profile $M --precision bf16 --top 30 > $X/prof.txt 2>&1; echo "rc=$?"; cat $X/prof.txt | cut -c1-220; t; }
echo done
