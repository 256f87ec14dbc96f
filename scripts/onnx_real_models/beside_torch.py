"""PyTorch's side of an imported model's bf16 check and timing (issue 46), on the GPU machine,
after models.py has written OUTDIR (state_dict.safetensors, batch.safetensors):

1. bf16 losses: the deterministic module from PyTorch's own weights, 5 SGD steps (lr as
   models.py) on the batch, forward and loss under torch.autocast(bfloat16), eager. Ingot's bf16
   run from the same weights and batch must be within 1% of each.
2. Step time and memory of what users run: torch.compile (default mode), bf16 autocast,
   cudnn.benchmark on, channels_last for the convolutional models; 5 warm-up steps, then the
   median of 20 timed steps (CUDA events around each). Peak: torch.cuda.max_memory_allocated()
   over the timed steps (parameters, gradients and activations; what PyTorch's allocator hands
   out), and max_memory_reserved() (what it holds from the driver).

Writes OUTDIR/torch_bf16.json and prints one line.
usage: beside_torch.py NAME OUTDIR"""
import json, os, sys
import torch, torch.nn.functional as F
from safetensors.torch import load_file
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from models import LR, TEXT, build
from torch_timing import time_steps

CONV = {"resnet18", "resnet50", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "unet"}


def loss_fn(name):
    if name in TEXT:
        return lambda z, y: F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1))
    if name == "unet":
        return F.mse_loss
    return F.cross_entropy


def inputs(name, x):
    if name.startswith("bert"):
        b, s = x.shape
        return (x, torch.ones(b, s, dtype=torch.long, device=x.device),
                torch.zeros(b, s, dtype=torch.long, device=x.device))
    return (x,)


def fresh(name, sd, channels_last):
    m = build(name, True)
    m.load_state_dict(sd, strict=True)
    m = m.cuda().train()
    if channels_last:
        m = m.to(memory_format=torch.channels_last)
    return m


def main(name, out):
    sd = load_file(f"{out}/state_dict.safetensors")
    batch = load_file(f"{out}/batch.safetensors")
    x, y = batch["x"].cuda(), batch["y"].cuda()
    lf = loss_fn(name)
    torch.backends.cudnn.benchmark = True

    # 1. bf16 autocast losses, eager (the reference for Ingot's bf16 run).
    m = fresh(name, sd, False)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    losses = []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lf(m(*inputs(name, x)), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    del m, opt
    torch.cuda.empty_cache()

    # 2. torch.compile, bf16 autocast, channels_last where it helps.
    cl = name in CONV
    m = fresh(name, sd, cl)
    xc = x.contiguous(memory_format=torch.channels_last) if cl else x
    fwd = torch.compile(m)
    opt = torch.optim.SGD(m.parameters(), lr=LR)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lf(fwd(*inputs(name, xc)), y)
        loss.backward()
        opt.step()
        return loss

    step_ms, allocated, reserved, warm = time_steps(step)
    r = {
        "model": name,
        "batch": int(x.shape[0]),
        "bf16_losses": losses,
        "compile_step_ms": step_ms,
        "compile_peak_allocated": allocated,
        "compile_peak_reserved": reserved,
        "channels_last": cl,
        "warmup_s": warm,
    }
    json.dump(r, open(f"{out}/torch_bf16.json", "w"))
    print(f"{name}: torch bf16 autocast losses {[round(v, 6) for v in losses]}; torch.compile"
          f"{' channels_last' if cl else ''} bf16 step {r['compile_step_ms']:.2f} ms, peak allocated"
          f" {r['compile_peak_allocated'] / 2**20:.1f} MiB, reserved {r['compile_peak_reserved'] / 2**20:.1f}"
          f" MiB (warm-up {warm:.0f} s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
