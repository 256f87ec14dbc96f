#!/bin/bash
# Session 38, the lead's first call (one H200): batch norm's output in its operand's dtype under
# the bf16 policy (NEW = main + the precision change) against main at the session's start
# (OLD), alternating: resnet50 224 b128 bf16, resnet18 (CIFAR) bf16, gpt2 bf16 (unchanged:
# no batch norm); NEW's resnet50 fused kernels against the CPU on the GPU; NEW's profile.
# usage: bash docs/results/gpu-s38-lead-call1-script.sh   (.device-bin/lead/bins.txz)
X=/tmp/s38lead; . scripts/device_prelude.sh
python3 -c "import tarfile; tarfile.open('.device-bin/lead/bins.txz').extractall('$X')"
N=$X/new; O=$X/old; END=${END:-165}
nvidia-smi --query-gpu=name --format=csv,noheader; t
echo "== resnet50 224 b128 bf16, 10 steps, OLD/NEW alternating"
R="--model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json"
for i in 1 2; do for b in O N; do eval B=\$$b
  echo -n "$b: "; timeout 40 $B/ingot train $R 2>$X/r.err | python3 scripts/summ.py || tail -3 $X/r.err
done; done; t
echo "== resnet18 (CIFAR) bf16, 30 steps"
for b in O N O N; do eval B=\$$b
  echo -n "$b: "; timeout 25 $B/ingot train --model resnet18 --device cuda --precision bf16 --steps 30 --json 2>$X/r.err | python3 scripts/summ.py || tail -3 $X/r.err
done; t
echo "== gpt2 bf16 SGD 20 steps"
for b in O N; do eval B=\$$b
  echo -n "$b: "; timeout 30 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 20 --json 2>$X/g.err | python3 scripts/summ.py || tail -3 $X/g.err
done; t
echo "== NEW cuda_kernels resnet50 side 56 b16 bf16 channels-last"
INGOT_REQUIRE_GPU=1 timeout $(( $(left $END) - 30 )) $N/cuda_kernels --precision bf16 --channels-last resnet:depth=50,side=56,batch=16 > $X/k.txt 2>&1; echo "rc=$?"
grep -E -i "mismatch|fail|panick|distinct|checked" $X/k.txt | head -6; tail -2 $X/k.txt; t
echo "== NEW cuda_profile resnet50 --top 25"
timeout $(( $(left $END) - 3 )) $N/cuda_profile resnet:depth=50,side=224,batch=128 --precision bf16 --top 25 2>&1 | tail -45; t
