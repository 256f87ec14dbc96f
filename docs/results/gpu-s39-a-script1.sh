#!/bin/bash
# Session 39, helper A (one H200), call 1, issue 48: what would make resnet50's stem (x [128, 3,
# 224, 224] bf16, w [64, 3, 7, 7], stride 2, pad 3) fast, measured before anything is built.
#  1. conv_probe (runtime/examples/conv_probe.rs): every deterministic algorithm cuDNN's
#     heuristics offer for the stem's filter gradient and forward, NCHW and channels-last,
#     3 channels and padded to 4 and 8, with 0, 56 MiB, 128 MiB, 512 MiB and 2 GiB of workspace.
#  2. PyTorch's own stem (scripts/torch_stem_probe.py): forward and filter gradient alone,
#     NCHW and channels_last, 3/4/8 channels, cudnn.benchmark on; its filter gradient's kernels.
#  3. OLD's cuda_profile of resnet50 224 bf16 b128 (INGOT_CONV=cudnn, INGOT_LOG=1: which path
#     each convolution took), the baseline.
# usage: bash .device-bin/a/gpu-s39-a-script1.sh (bins.tar.xz beside it: new/, old/).
X=/tmp/a; source scripts/device_prelude.sh
D=.device-bin/a
python3 -c "import tarfile; tarfile.open('$D/bins.tar.xz').extractall('$X')"
N=$X/new; O=$X/old; chmod +x $N/* $O/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; date -u
echo "== conv_probe (stem)"
timeout 50 $N/conv_probe; echo "rc=$?"; t
echo "== torch stem"
timeout 45 python3 $D/torch_stem_probe.py; echo "rc=$?"; t
echo "== OLD cuda_profile resnet50 224 bf16 b128, INGOT_CONV=cudnn INGOT_LOG=1"
INGOT_CONV=cudnn INGOT_LOG=1 timeout $(( $(left 166) - 2 )) $O/cuda_profile resnet:depth=50,side=224,batch=128 --precision bf16 --top 25 > $X/prof.txt 2>&1
echo "rc=$?"; grep "^step:" $X/prof.txt | head -2; grep "^step:" $X/prof.txt | tail -2; grep -v "^step:\|^eval step:" $X/prof.txt | head -40; t
echo done
