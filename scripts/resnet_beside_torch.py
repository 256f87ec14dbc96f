"""torchvision's ResNet under torch.compile, as users run it, for `ingot train --model
resnet:depth=D,side=S,batch=B` beside it (issue 48), on the GPU machine: default mode,
cudnn.benchmark on, channels_last (or NCHW), forward and loss under bf16 autocast (or f32 with
TF32 on or off), SGD (lr 0.1, momentum 0.9, weight decay 5e-4, as Ingot's resnet) on a fixed random batch. 5 warm-up steps, then the
median of 20 timed steps (CUDA events around each), and torch.cuda.max_memory_allocated()
over the timed steps. One JSON line per run.
usage: resnet_beside_torch.py --depth 50 --side 224 --batch 128 --precision bf16|tf32|f32 [--nchw]"""
import argparse, json
import torch, torch.nn.functional as F, torchvision
from torch_timing import time_steps

p = argparse.ArgumentParser()
p.add_argument("--depth", type=int, default=50)
p.add_argument("--side", type=int, default=224)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--classes", type=int, default=1000)
p.add_argument("--precision", default="bf16", choices=["bf16", "tf32", "f32"])
p.add_argument("--nchw", action="store_true")
a = p.parse_args()
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
torch.manual_seed(0)
m = getattr(torchvision.models, f"resnet{a.depth}")(num_classes=a.classes).cuda().train()
x = torch.randn(a.batch, 3, a.side, a.side, device="cuda")
y = torch.randint(0, a.classes, (a.batch,), device="cuda")
if not a.nchw:
    m = m.to(memory_format=torch.channels_last)
    x = x.contiguous(memory_format=torch.channels_last)
fwd = torch.compile(m)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
        loss = F.cross_entropy(fwd(x), y)
    loss.backward()
    opt.step()


step_ms, allocated, reserved, _ = time_steps(step)
print(json.dumps({"system": "torch.compile" + ("" if a.nchw else " channels_last"), "depth": a.depth,
                  "side": a.side, "batch": a.batch, "precision": a.precision,
                  "step_ms": step_ms, "peak_mib": allocated / 2**20, "reserved_mib": reserved / 2**20}), flush=True)
