#!/bin/bash
# Session 39, the lead's first final call (two H200s, 32 cores): issue 46's table, every listed
# model at its real size, imported from ONNX beside PyTorch on the same weights and batch, in
# one call: scripts/onnx_real_models/bench.sh (export on the device, PyTorch's 5 bf16 autocast
# losses and its torch.compile step and peak, then Ingot's 30 bf16 steps from those weights),
# the models split between the two GPUs (one lane each, one model at a time). Then the built-in
# models of the same shapes (resnet50 at batch 32, GPT-2 small's shape) for the "within 10%"
# goal, on the GPU whose lane ends first.
# usage: END=570 bash docs/results/gpu-s39-final1-script.sh   (.device-bin/lead/new.txz)
X=/tmp/s39f1; . scripts/device_prelude.sh
L=.device-bin/lead
unpack() { python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$2"; }
mkdir -p $X/new && unpack $L/new.txz $X/new
N=$X/new; END=${END:-570}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
lane() { # GPU, budget (s), models...
  local g=$1 b=$2; shift 2
  CUDA_VISIBLE_DEVICES=$g WORK=$X/w$g BUDGET_S=$b MODELS="$*" BIN=$N/ingot \
    timeout $(( $(left $END) - 15 )) bash scripts/onnx_real_models/bench.sh > $X/lane$g.txt 2>&1
}
lane 0 420 resnet50 gpt2_124m efficientnet_b0 & P0=$!
lane 1 420 vit_b_16 bert_base unet resnet18 convnext_tiny mobilenet_v3_small & P1=$!
wait $P0
echo "== GPU 0 lane (resnet50, gpt2_124m, efficientnet_b0)"; cat $X/lane0.txt; t
export CUDA_VISIBLE_DEVICES=0
run() { local l=$1 s=$2; shift 2; echo -n "$l: "; timeout $s "$@" 2>$X/run.err | python3 scripts/summ.py || tail -3 $X/run.err; }
echo "== built-in models of the imported shapes, bf16, SGD lr 0.01, 30 steps (GPU 0)"
[ $(left $END) -gt 60 ] && run "built-in resnet50 224 b32" 50 $N/ingot train --model resnet:depth=50,side=224,batch=32 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 30 --json
[ $(left $END) -gt 50 ] && run "built-in gpt vocab 50257 (GPT-2 small's shape) b8 s1024" 45 $N/ingot train --model gpt:vocab=50257,d_model=768,layers=12,heads=12,d_ff=3072,seq=1024,batch=8 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 30 --json
t
wait $P1
echo "== GPU 1 lane (vit_b_16, bert_base, unet, resnet18, convnext_tiny, mobilenet_v3_small)"; cat $X/lane1.txt; t; echo done
