#!/usr/bin/env python3
"""PyTorch DistributedDataParallel timing of a model as `ingot` names it, for the data-parallel
figures beside Ingot's (scripts/ddp_check.sh runs it).

    python3 -m torch.distributed.run --nproc_per_node=N scripts/torch_ddp.py \
        --model gpt2 [--precision f32|bf16] [--steps 30] [--warmup 5]

Each rank trains the model of scripts/torch_reference.py (same shapes, AdamW) on its own random
batch of the model's per-GPU batch size, with DDP's defaults (25 MiB buckets, NCCL). Rank 0
prints one JSON line: world size, model, precision, median step time over the timed steps
(CUDA events around forward, backward and the optimizer step, after a barrier-free warmup).
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import build, gpt_config  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="torch.compile the DDP model")
    a = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = gpt_config(a.model)
    model, opt = build(a.model, foreach=None)
    model = model.cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    optimizer = opt(ddp.parameters())
    run = torch.compile(ddp) if a.compile else ddp
    g = torch.Generator(device="cuda").manual_seed(1000 + rank)
    if cfg is None:
        x = torch.randn(256, 784, device="cuda", generator=g)
        y = torch.randint(0, 10, (256,), device="cuda", generator=g)
    else:
        shape = (cfg["batch"], cfg["seq"])
        x = torch.randint(0, cfg["vocab"], shape, device="cuda", generator=g)
        y = torch.randint(0, cfg["vocab"], shape, device="cuda", generator=g)
    times = []
    for i in range(a.warmup + a.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = run(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(start.elapsed_time(end))
        if i == a.warmup - 1:
            torch.cuda.reset_peak_memory_stats()
    if rank == 0:
        print(json.dumps({
            "world": world,
            "model": a.model,
            "precision": a.precision,
            "per_gpu_batch": None if cfg is None else cfg["batch"],
            "compile": a.compile,
            "median_step_ms": statistics.median(times),
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20,
            "loss": float(loss),
        }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
