#!/usr/bin/env python3
"""A plain PyTorch training loop over a token file, the counterpart of
`ingot train --model M --dataset train.bin --epochs N --order sequential --device cuda --json`,
for issue 18's memory check: one JSON line per epoch with torch.cuda.memory_allocated and
memory_reserved (and the device's free memory) at the epoch's end, and steps per second.

    python3 scripts/torch_data_loop.py --model gpt-mini --dataset train.bin --epochs 3

The model and optimizer are scripts/torch_reference.py's (PyTorch's default foreach AdamW, as a
PyTorch user gets it); batches are cut as Ingot's sequential order cuts them: row r of an epoch
starts at token r * seq and holds seq + 1 tokens, `batch` rows a batch, the final partial batch
dropped. The token file is raw little-endian uint16 (nanoGPT's train.bin, `ingot data bytes`).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import build, gpt_config, fail  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dataset", required=True, help="raw little-endian uint16 tokens")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        fail("this check needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(a.seed)
    cfg = gpt_config(a.model)
    if cfg is None:
        fail("a token file trains a GPT model")
    batch, seq = cfg["batch"], cfg["seq"]
    tokens = np.memmap(a.dataset, dtype="<u2", mode="r")
    rows = (len(tokens) - 1) // seq
    per_epoch = rows // batch
    if per_epoch == 0:
        fail(f"{a.dataset}: {len(tokens)} tokens cannot fill one batch")
    device = torch.device("cuda")
    model, make_optimizer = build(a.model, foreach=None)
    model.to(device=device, dtype=torch.float32).train()
    opt = make_optimizer(model.parameters())
    step = 0
    for epoch in range(a.epochs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = 0.0
        for b in range(per_epoch):
            starts = (np.arange(batch) + b * batch) * seq
            win = np.stack([tokens[s : s + seq + 1] for s in starts]).astype(np.int64)
            x = torch.from_numpy(win[:, :-1]).to(device, non_blocking=True)
            y = torch.from_numpy(win[:, 1:]).to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = model(x, y)
            loss.backward()
            opt.step()
            total += loss.item()
            step += 1
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        free, _ = torch.cuda.mem_get_info()
        print(
            json.dumps(
                {
                    "epoch_end": epoch,
                    "step": step,
                    "mean_loss": total / per_epoch,
                    "memory_allocated": torch.cuda.memory_allocated(),
                    "memory_reserved": torch.cuda.memory_reserved(),
                    "free_device_bytes": free,
                    "steps_per_s": per_epoch / seconds,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
