"""Where torchvision's ResNet step under torch.compile goes on the GPU, kernel by kernel (issue 48).

    python3 scripts/torch_resnet_profile.py [--depth 50] [--side 224] [--batch 128] [--steps 3] [--top 60]

The step is scripts/resnet_beside_torch.py's (channels_last, bf16 autocast, cudnn.benchmark on,
SGD lr 0.1 momentum 0.9 weight decay 5e-4, torch.compile default mode). After 5 warm-up steps
(the first compiles), torch.profiler records N steps; printed per step: device time by kind
(convolution: cuDNN's, CUTLASS's and the `nvjet_sm90` cuBLAS kernels cuDNN runs 1x1
convolutions through, all matched by name; Triton-fused; GEMM: other cuBLAS kernels, i.e. the
classifier; other), then the costliest kernels
with their count and mean time, to set beside Ingot's `cuda_profile` of the same model.
"""
import argparse
import re
from collections import defaultdict

import torch
import torchvision

ap = argparse.ArgumentParser()
ap.add_argument("--depth", type=int, default=50)
ap.add_argument("--side", type=int, default=224)
ap.add_argument("--batch", type=int, default=128)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--top", type=int, default=60)
a = ap.parse_args()

torch.backends.cudnn.benchmark = True
m = getattr(torchvision.models, f"resnet{a.depth}")().cuda().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
x = torch.randn(a.batch, 3, a.side, a.side, device="cuda").to(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (a.batch,), device="cuda")
cm = torch.compile(m)


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(cm(x), y)
    loss.backward()
    opt.step()


for _ in range(5):
    step()
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
times = []
for _ in range(10):
    s.record(); step(); e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e))
times.sort()
print(f"median step (CUDA events, 10 steps): {times[5]:.3f} ms")


def kind(n):
    l = n.lower()
    if re.search(r"conv|dgrad|wgrad|fprop|implicit|xmma|cudnn|cutlass|sm90_|sm80_", l):
        return "convolution (cuDNN/CUTLASS)"
    if l.startswith("triton"):
        return "triton fused"
    if re.search(r"gemm|nvjet|cublas", l):
        return "gemm"
    return "other"


with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
by_kind = defaultdict(float)
by_name = defaultdict(lambda: [0, 0.0])
for ev in prof.events():
    if ev.device_type != torch.autograd.DeviceType.CUDA:
        continue
    t = ev.time_range.elapsed_us()
    by_kind[kind(ev.name)] += t
    by_name[ev.name][0] += 1
    by_name[ev.name][1] += t
total = sum(by_kind.values())
print(f"device time a step (sum of kernels): {total / a.steps / 1000:.3f} ms")
for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]):
    print(f"  {k:32s} {v / a.steps / 1000:8.3f} ms")
print(f"top {a.top} kernels: ms a step, launches a step, mean us")
for n, (c, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[: a.top]:
    print(f"  {t / a.steps / 1000:8.3f} {c // a.steps:5d} {t / c:9.1f}  {n[:150]}")
