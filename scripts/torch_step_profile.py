"""Where PyTorch's training step goes on the GPU, by kind and by GEMM shape (issue 52).

    python3 scripts/torch_step_profile.py MODEL [--steps N] [--warmup N] [--top N]

MODEL as `ingot` takes it (gpt2, gpt2-medium, gpt:vocab=..,...). The step is the peer that
scripts/gpu_bench.py times as "torch-compile-sdpa" (scripts/torch_reference.py's GPT,
torch.compile of forward + loss, SDPA attention, bf16 autocast), with plain SGD lr 0.01 (as
Ingot's `--optimizer sgd --lr 0.01`), so that the two sides' steps do the same work. After
the warm-up (which compiles), torch.profiler records N steps; printed per step: the device
time of each kind of kernel (GEMM, attention, Triton-fused, other), the costliest kernels, and
each matmul's shapes (aten::mm/addmm/bmm with record_shapes) with its device time.
"""
import argparse
import os
import re
import sys
from collections import defaultdict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import torch_reference as tr  # noqa: E402


def kind(name):
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n or "efficient" in n:
        return "attention"
    if re.search(r"gemm|nvjet|xmma|cutlass|cublas|sm90_|sm80_", n):
        return "gemm"
    if n.startswith("triton"):
        return "triton fused"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    tr.ATTENTION = "sdpa"
    cfg = tr.gpt_config(a.model)
    model, _ = tr.build(a.model, foreach=None)
    model.to("cuda").train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=g).cuda()
    y = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=g).cuda()
    fwd = torch.compile(model)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        e0.record()
        step()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    times.sort()
    print(f"torch.compile+SDPA+SGD {a.model}: step {times[2]:.3f} ms (median of 5, {times})")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
    by_kind = defaultdict(lambda: [0.0, 0])
    by_kernel = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            by_kind[kind(e.name)][0] += us
            by_kind[kind(e.name)][1] += 1
            by_kernel[e.name][0] += us
            by_kernel[e.name][1] += 1
    total = sum(v[0] for v in by_kind.values())
    print(f"kernels per step: {total / a.steps / 1e3:.3f} ms")
    for k, (us, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"  {k:14s} {us / a.steps / 1e3:9.3f} ms {n // a.steps:6d} kernels {100 * us / total:5.1f}%")
    print("costliest kernels (per step):")
    for name, (us, n) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[: a.top]:
        print(f"  {us / a.steps / 1e3:8.3f} ms x{n // a.steps:<4d} {us / n:8.1f} us each  {name[:150]}")
    print("matmuls by input shapes (per step; device time of the op's kernels):")
    rows = []
    for ev in prof.key_averages(group_by_input_shape=True):
        if ev.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul"):
            dt = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            rows.append((dt, ev.key, ev.count, ev.input_shapes))
    for dt, key, count, shapes in sorted(rows, key=lambda r: -r[0]):
        print(f"  {dt / a.steps / 1e3:8.3f} ms x{count // a.steps:<4d} {dt / count:8.1f} us each  {key} {shapes}")


if __name__ == "__main__":
    main()
