"""Issue 46's f32 check at real size (session 44): a model exported at its real widths on the
CPU (no GPU needed, so exports can run beside a timing), then PyTorch's strict f32 losses (TF32
off) on the GPU from the same weights and batch, then Ingot's `--precision f32` run compared.

    f32_real.py export NAME OUTDIR [--dynamo]   # det.onnx, state_dict.safetensors, batch.safetensors
    f32_real.py torch NAME OUTDIR [--zir]       # torch_f32.json: 5 SGD steps, lr models.LR
    ingot train --onnx OUTDIR/det.onnx ... --precision f32 --json | f32_real.py compare NAME OUTDIR [--zir]

NAME is one of models.py's (resnet18, resnet50, gpt2_124m, bert_base, ...): images 224x224 at
batch BATCH (default 8), text at sequence SEQ (default 128) and batch BATCH. For a ResNet,
`export` also writes state_dict_zir.safetensors: the same weights with each residual branch's
last batch-norm weight zero, as torchvision's `zero_init_residual=True` initialises them (a
well-conditioned start, session 43); `--zir` runs from it. The batch is seeded (generator 1).
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

D = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [D, os.path.join(D, ".."), "scripts/onnx_real_models", "scripts"]
# export_onnx before models (which puts its own folder's parent first on the path): a copy
# beside this file is the one used (session 44's call imported the checkout's older one, which
# lacks `dynamo`, so its dynamo exports did not run).
from export_onnx import export  # noqa: E402
import models  # noqa: E402

B = int(os.environ.get("BATCH", "8"))


def sized(name):
    if name in models.TEXT:
        models.TEXT[name] = (models.TEXT[name][0], int(os.environ.get("SEQ", "128")))


def zero_residual(m):
    """torchvision's zero_init_residual: each block's last batch-norm weight 0."""
    from torchvision.models.resnet import BasicBlock, Bottleneck
    for b in m.modules():
        if isinstance(b, Bottleneck):
            nn.init.zeros_(b.bn3.weight)
        elif isinstance(b, BasicBlock):
            nn.init.zeros_(b.bn2.weight)
    return m


def batch(name):
    g = torch.Generator().manual_seed(1)
    if name in models.TEXT:
        vocab, seq = models.TEXT[name]
        return (torch.randint(0, vocab, (B, seq), generator=g),
                torch.randint(0, vocab, (B, seq), generator=g))
    return torch.randn(B, 3, 224, 224, generator=g), torch.randint(0, 1000, (B,), generator=g)


def call_args(name, x):
    if name.startswith("bert"):
        return (x, torch.ones_like(x), torch.zeros_like(x)), ["input_ids", "attention_mask", "token_type_ids"]
    return (x,), ["input_ids" if name in models.TEXT else "input"]


def state(m):
    return {k: v.detach().clone().contiguous() for k, v in m.state_dict().items()}


def do_export(name, out, dynamo):
    os.makedirs(out, exist_ok=True)
    m = models.build(name, True)
    x, y = batch(name)
    save_file(state(m), f"{out}/state_dict.safetensors")
    if name.startswith("resnet"):
        save_file(state(zero_residual(models.build(name, True))), f"{out}/state_dict_zir.safetensors")
    save_file({"x": x.contiguous(), "y": y.contiguous()}, f"{out}/batch.safetensors")
    args, names = call_args(name, x)
    kw = {"dynamo": True, "opset": __import__("onnx").defs.onnx_opset_version()} if dynamo else {}
    export(m, args, f"{out}/{'dynamo' if dynamo else 'det'}.onnx", input_names=names, **kw)
    print(f"{name}: exported{' (dynamo)' if dynamo else ''}, batch {tuple(x.shape)}", flush=True)


def do_torch(name, out, zir):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    m = models.build(name, True)
    m.load_state_dict(load_file(f"{out}/state_dict{'_zir' if zir else ''}.safetensors"), strict=True)
    dev = os.environ.get("DEVICE", "cuda")  # cpu: to try the script without a GPU
    m = m.to(dev).train()
    b = load_file(f"{out}/batch.safetensors")
    x, y = b["x"].to(dev), b["y"].to(dev)
    args, _ = call_args(name, x)
    opt = torch.optim.SGD(m.parameters(), lr=models.LR)
    losses = []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        z = m(*args)
        loss = F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    json.dump({"losses": losses}, open(f"{out}/torch_f32{'_zir' if zir else ''}.json", "w"))
    print(f"{name}{' zir' if zir else ''}: torch strict f32 losses {[round(v, 6) for v in losses]}", flush=True)


def do_compare(name, out, zir):
    from summ import read_run
    losses, summary = read_run(sys.stdin)
    t = json.load(open(f"{out}/torch_f32{'_zir' if zir else ''}.json"))["losses"]
    if len(losses) < 5 or summary is None:
        sys.exit(f"{name}: fewer than 5 losses or no summary from ingot")
    d = [abs(a - b) / abs(b) for a, b in zip(losses[:5], t)]
    mib = lambda v: v / 2**20 if v is not None else float("nan")
    print(f"{name}{' zir' if zir else ''} batch {B}: f32 losses ingot {[round(v, 6) for v in losses[:5]]} torch "
          f"{[round(v, 6) for v in t]}: relative differences {', '.join(f'{v:.1e}' for v in d)}; largest {max(d):.2e} "
          f"({'within' if max(d) <= 1e-4 else 'OVER'} 1e-4); planned {mib(summary.get('planned_bytes')):.1f} MiB "
          f"measured {mib(summary.get('measured_bytes')):.1f} MiB", flush=True)


if __name__ == "__main__":
    cmd, name, out = sys.argv[1:4]
    flags = set(sys.argv[4:])
    sized(name)
    if cmd == "export":
        do_export(name, out, "--dynamo" in flags)
    elif cmd == "torch":
        do_torch(name, out, "--zir" in flags)
    else:
        do_compare(name, out, "--zir" in flags)
