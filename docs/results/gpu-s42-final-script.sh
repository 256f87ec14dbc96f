#!/bin/bash
# Session 42, the lead's final call on one H200: the merged tree (NEW: main with branches
# s42-a, -b, -c, -d, -e, -f) against main at the session's start (OLD, d6eef9e).
# 1. gpt2 bf16 (F: epilogues off by default, same operations), resnet50 224 b128 bf16 (A's
#    split column reductions, E's filter-gradient order), resnet18 and cnn (CIFAR) bf16, OLD
#    and NEW alternating, two rounds each: median step, planned and measured bytes, last loss.
# 2. convnext_tiny (C's depthwise kernels): the executables each binary compiled here from
#    the session-40 export (batch 32, bf16), `ingot run --steps 20`, seeded weights, alternated.
# 3. The GPU tests of what changed, INGOT_REQUIRE_GPU=1, one at a time.
# 4. If time is left: torch.compile + channels_last convnext_tiny bf16 batch 32, its step.
# usage: END=440 bash docs/results/gpu-s42-final-script.sh  (.device-bin/lead/final.txz)
X=/tmp/s42f; . scripts/device_prelude.sh
END=${END:-440}
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .device-bin/lead/final.txz $X
N=$X/new; O=$X/old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; t
run() { # label, timeout, binary, args...: one summary line
  local l=$1 s=$2 b=$3; shift 3
  echo -n "$l: "; timeout $s $b "$@" 2>$X/run.err | python3 scripts/summ.py || tail -3 $X/run.err
}
echo "== gpt2 bf16 SGD lr 0.01, 20 steps"
for b in O N O N; do eval B=\$$b
  run "gpt2 $b" 45 $B/ingot train --model gpt2 --device cuda --precision bf16 --optimizer sgd --lr 0.01 --steps 20 --json
done; t
echo "== resnet50 224 b128 bf16, 10 steps"
for b in O N O N; do eval B=\$$b
  run "resnet50 $b" 60 $B/ingot train --model resnet:depth=50,side=224,batch=128 --device cuda --precision bf16 --steps 10 --json
done; t
echo "== resnet18 (CIFAR) and cnn bf16, 30 steps"
for m in resnet18 cnn; do for b in O N O N; do eval B=\$$b
  run "$m $b" 30 $B/ingot train --model $m --device cuda --precision bf16 --steps 30 --json
done; done; t
echo "== convnext_tiny (export of session 40, batch 32) bf16, ingot run, 20 steps"
for b in O N O N; do eval B=\$$b
  run "convnext_tiny $b" 60 $B/ingot run $B/convnext.ingot --device cuda --steps 20 --json
done; t
echo "== GPU tests"
gpu_test_lane 0 $((END-90)) $N cuda_depthwise cuda_epilogue cuda_channels_last cuda_conv cuda_cudnn cuda_conv_room cuda_matmul_acc cuda_kernels cuda_bf16_kernels
cat $X/lane_tests.txt; t
if [ "$(left $END)" -gt 100 ]; then
echo "== torch.compile + channels_last convnext_tiny bf16 autocast, batch 32, SGD"
timeout $(( $(left $END) - 10 )) python3 - <<'PY'
import torch, torchvision, time
m = torchvision.models.convnext_tiny().cuda().to(memory_format=torch.channels_last)
x = torch.randn(32,3,224,224,device='cuda').to(memory_format=torch.channels_last); y = torch.randint(0,1000,(32,),device='cuda')
opt = torch.optim.SGD(m.parameters(), lr=0.01)
def step():
    with torch.autocast('cuda', dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(m(x), y)
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
for name, f in [("eager", step), ("torch.compile", torch.compile(step))]:
    for _ in range(5): f()
    torch.cuda.synchronize(); ts=[]
    for _ in range(20):
        a=torch.cuda.Event(enable_timing=True); b=torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); print(f"{name}: median step {ts[10]:.3f} ms, peak allocated {torch.cuda.max_memory_allocated()} B")
PY
fi
t; echo done
