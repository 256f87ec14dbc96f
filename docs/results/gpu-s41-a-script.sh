#!/bin/bash
# Session 41, helper A (one H200), issue 48: the max pooling's gradient from its picks, a thread
# a block of stride x stride input elements (kernels/src/cuda/window.rs max_pool2d_grad_blocked).
# NEW = s41-a; OLD = main's binary at the session's start (/tmp/s41-old).
#  1. resnet50 224 bf16 b128, default routes, `ingot train --steps 10 --json`, NEW and OLD
#     alternating, three rounds (median step, planned / measured bytes, the 10 losses).
#  2. resnet18 (CIFAR) and cnn bf16 default, 30 steps, NEW and OLD alternating, two rounds.
#  3. cuda_profile of resnet50, NEW then OLD (the pooling rows, the op-by-op totals).
#  4. resnet18's convolutions: the algorithm each load chooses in its planned workspace
#     (INGOT_LOG) and cuDNN's offers (cudnn_offers), for the workspace question (no change).
#  5. GPU tests: trainer's cuda_conv (the cnn's 2x2 pooling on the GPU against the CPU, f32
#     and bf16), INGOT_REQUIRE_GPU=1.
# usage: bash .device-bin/a/gpu-s41-a-script.sh (bins.tar.xz and device_prelude.sh beside it).
D=.device-bin/a
X=/tmp/a; source $D/device_prelude.sh
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
N=$X/new; O=$X/old; chmod +x $N/* $O/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
M=resnet:depth=50,side=224,batch=128
# train LABEL ROUND TIMEOUT MODEL STEPS [ENV...]
train() { eval B=\$$1; local l=$1 r=$2 to=$3 m=$4 s=$5; shift 5; echo "-- $m $l round $r $*"
  env "$@" timeout $to $B/ingot train --model $m --device cuda --precision bf16 --steps $s --json > $X/t_${l}_$r.json 2> $X/t_${l}_$r.err; echo "rc=$?"
  python3 scripts/summ.py < $X/t_${l}_$r.json || tail -3 $X/t_${l}_$r.err
  python3 -c "import json; L=[json.loads(l) for l in open('$X/t_${l}_$r.json') if l.startswith('{')]; print('losses', [x.get('loss') for x in L if 'loss' in x][:12])" 2>/dev/null; }
same() { cmp -s <(grep -o '"loss":[^,]*' $X/t_$1.json) <(grep -o '"loss":[^,]*' $X/t_$2.json) && echo "losses $1 = $2 (bit for bit as printed)" || echo "losses $1 != $2"; }
echo "== resnet50 224 bf16 b128, default routes, NEW/OLD alternating"
for r in 1 2 3; do train N r5$r 60 $M 10; train O r5$r 60 $M 10; t; done
same N_r51 O_r51; same N_r52 O_r52; same N_r51 N_r52
for m in resnet18 cnn; do
  echo "== $m bf16 default, 30 steps, NEW/OLD alternating"
  for r in 1 2; do train N $m$r 30 $m 30; train O $m$r 30 $m 30; t; done
  same N_${m}1 O_${m}1
done
echo "== cuda_profile resnet50, NEW then OLD"
for B in N O; do eval P=\$$B
  [ $(left 200) -gt 40 ] && { timeout 60 $P/cuda_profile $M --precision bf16 --top 30 > $X/prof_$B.txt 2>&1; echo "$B rc=$?"; head -6 $X/prof_$B.txt | cut -c1-200; grep -E "max_pool|  other" $X/prof_$B.txt | cut -c1-160; cp $X/prof_$B.txt $OUT/; t; }
done
echo "== resnet18's convolutions: chosen algorithms (NEW, INGOT_LOG) and cuDNN's offers"
[ $(left 230) -gt 30 ] && { INGOT_LOG=1 timeout 30 $N/ingot train --model resnet18 --device cuda --precision bf16 --steps 2 --json 2>&1 >/dev/null | grep "^step: conv" > $OUT/resnet18_conv_choices.txt; wc -l < $OUT/resnet18_conv_choices.txt
  timeout 20 $N/ingot compile --model resnet18 --device cuda --precision bf16 -o $X/r18.exe > /dev/null 2>&1 && timeout 30 $N/cudnn_offers $X/r18.exe > $OUT/resnet18_cudnn_offers.txt 2>&1; echo "offers rc=$?"; t; }
echo "== GPU tests"
[ $(left 262) -gt 25 ] && { INGOT_REQUIRE_GPU=1 timeout $(( $(left 262) - 3 )) $N/cuda_conv --test-threads=1 > $X/cuda_conv.txt 2>&1; echo "cuda_conv rc=$?"; grep -E "^test |test result|panicked" $X/cuda_conv.txt | head -20; }
t; echo done
