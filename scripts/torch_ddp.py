#!/usr/bin/env python3
"""PyTorch DistributedDataParallel timing of a model as `ingot` names it, for the data-parallel
figures beside Ingot's (scripts/ddp_check.sh runs it).

    python3 -m torch.distributed.run --nproc_per_node=N scripts/torch_ddp.py \
        --model gpt2 [--precision f32|bf16] [--steps 30] [--warmup 5] \
        [--compile [--attention sdpa] [--compile-optimizer]] [--bf16-compress]

Each rank trains the model of scripts/torch_reference.py (same shapes, AdamW) on its own random
batch of the model's per-GPU batch size, with DDP's defaults (25 MiB buckets, NCCL). Rank 0
prints one JSON line: world size, model, precision, median step time over the timed steps
(CUDA events around forward, backward and the optimizer step, after a barrier-free warmup).

The strongest peer, what a PyTorch user of an H100 runs (as scripts/gpu_bench.py's
torch-compile-sdpa on one GPU): `--precision bf16 --compile --attention sdpa
--compile-optimizer`, and `--bf16-compress` for DDP's bf16 all-reduce (its
bf16_compress_hook, what Ingot's --reduce-in-bf16 does).
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as tr  # noqa: E402
from torch_reference import build, gpt_config  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="torch.compile the DDP model")
    ap.add_argument("--attention", default="plain", choices=["plain", "sdpa"],
                    help="attention as written, or PyTorch's fused scaled_dot_product_attention")
    ap.add_argument("--compile-optimizer", action="store_true",
                    help="torch.compile the optimizer step too (PyTorch's recipe)")
    ap.add_argument("--bf16-compress", action="store_true",
                    help="all-reduce the gradients in bf16 (DDP's bf16_compress_hook)")
    ap.add_argument("--no-ddp", action="store_true",
                    help="one process only: the same model and loop without the DDP wrapper, "
                         "to see what DDP itself costs")
    a = ap.parse_args()
    tr.ATTENTION = a.attention
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    # As scripts/gpu_bench.py: TF32 allowed where a bf16 run leaves f32 matmuls, never in f32.
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "bf16"
    torch.backends.cudnn.allow_tf32 = a.precision == "bf16"
    cfg = gpt_config(a.model)
    model, opt = build(a.model, foreach=None)
    model = model.cuda()
    if a.no_ddp and world != 1:
        sys.exit("--no-ddp runs one process only")
    ddp = model if a.no_ddp else torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    if a.bf16_compress and not a.no_ddp:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    optimizer = opt(ddp.parameters())
    run = torch.compile(ddp) if a.compile else ddp
    opt_step = optimizer.step
    if a.compile_optimizer:
        @torch.compile
        def opt_step():
            optimizer.step()
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
        opt_step()
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
            "attention": a.attention,
            "compile_optimizer": a.compile_optimizer,
            "bf16_compress": a.bf16_compress,
            "ddp": not a.no_ddp,
            "median_step_ms": statistics.median(times),
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20,
            "loss": loss.item(),
        }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
