#!/bin/bash
# Session 36 helper A, call 1: facts on main's build (OLD) for resnet50 224 bf16 channels-last.
# (The cuDNN path below printed a TypeError on that machine, nvidia.cudnn being a namespace
# package; cuDNN loaded from the default paths all the same: the convolutions ran through it.)
D=.device-bin/a
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cudnn,os;print(os.path.dirname(nvidia.cudnn.__file__))')/lib:$LD_LIBRARY_PATH
export INGOT_CONV=cudnn
LOG=$OUT/gpu-s36-a-profile-old.txt
{
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== cuda_profile OLD --top 120"
timeout 110 $D/cuda_profile resnet:depth=50,side=224,batch=128 --precision bf16 --top 120
echo "rc $?"
echo "== cuda_profile OLD --timeline --csv"
timeout 50 $D/cuda_profile resnet:depth=50,side=224,batch=128 --precision bf16 --timeline --top 5 --csv $OUT/timeline-old.csv
echo "rc $?"
date -u
} > $LOG 2>&1
