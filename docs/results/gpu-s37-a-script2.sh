#!/bin/bash
# Session 37, helper A (one H200), call 2, issue 48: NEW = s37-a, the column reductions
# several channels a thread folding their partials pairwise (colvec.rs after call 1, where a
# chain fold over up to 256 partials a lane made them slower); the weight/bias-gradient merge
# rule of call 1 taken out; OLD = main at the session's start (/tmp/s37-old).
#  1. resnet50 224 bf16 batch 128, INGOT_CONV=cudnn, `ingot train --steps 10 --json`,
#     NEW and OLD alternating, two rounds (the first NEW run compiles its kernels).
#  2. gpt2 bf16 SGD lr 0.01, 20 steps, NEW then OLD.
#  3. cuda_profile NEW then OLD, resnet50 224 bf16, --top 40.
# usage: bash .device-bin/a/gpu-s37-a-script2.sh (bins.tgz beside it: new/, old/).
X=/tmp/a; source scripts/device_prelude.sh
D=.device-bin/a
tar xzf $D/bins.tgz -C $X
N=$X/new; O=$X/old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u
M=resnet:depth=50,side=224,batch=128
train() { eval B=\$$1; echo "-- train $1 round $2"
  INGOT_CONV=cudnn timeout $3 $B/ingot train --model $M --device cuda --precision bf16 --steps 10 --json > $X/train_$1.json 2> $X/train_$1.err; echo "rc=$?"
  python3 scripts/summ.py < $X/train_$1.json || tail -3 $X/train_$1.err; }
echo "== resnet50 224 bf16 b128, cudnn, NEW/OLD alternating"
train N 1 70; t; train O 1 30; t
[ $(left 165) -gt 60 ] && { train N 2 25; t; train O 2 25; t; }
gpt() { eval B=\$$1; echo "-- gpt2 $1"
  timeout 30 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 20 --json > $X/gpt_$1.json 2> $X/gpt_$1.err; echo "rc=$?"
  python3 scripts/summ.py < $X/gpt_$1.json || tail -3 $X/gpt_$1.err; }
echo "== gpt2 bf16 SGD, 20 steps"
for B in N O; do [ $(left 165) -gt 35 ] && { gpt $B; t; }; done
echo "== cuda_profile NEW --top 40"
[ $(left 165) -gt 25 ] && INGOT_CONV=cudnn timeout $(( $(left 165) - 3 )) $N/cuda_profile $M --precision bf16 --top 40
echo "rc=$?"; t
echo done
