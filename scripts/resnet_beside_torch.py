"""torchvision's ResNet under torch.compile, as users run it, for `ingot train --model
resnet:depth=D,side=S,batch=B` beside it (issue 48), on the GPU machine: default mode,
cudnn.benchmark on, channels_last (or NCHW), forward and loss under bf16 autocast (or f32 with
TF32 on or off), SGD (lr 0.1, momentum 0.9, weight decay 5e-4, as Ingot's resnet) on a fixed random batch. 5 warm-up steps, then the
median of 20 timed steps (CUDA events around each), and torch.cuda.max_memory_allocated()
over the timed steps. One JSON line per run.

--checkpoint-blocks (issue 51) wraps every residual block of layer1..layer4 (a Bottleneck or
BasicBlock) in torch.utils.checkpoint (non-reentrant, as PyTorch recommends), the usual
practice under a memory limit: only the blocks' inputs are kept, and each block's forward runs
again in the backward pass. torch.compile compiles the checkpointed model as users write it;
if that fails, the step runs eager (and the line says so, with the error). --eager runs
without torch.compile. As in PyTorch, a checkpointed block's recomputation updates batch
norm's running statistics a second time (they are not read by a training step).

--lock FILE: the first step (the compile) runs at once, then the warm-up and timed steps wait
for an exclusive flock on FILE, so that several of these processes can compile at the same
time on one machine and still time their steps one at a time.
usage: resnet_beside_torch.py --depth 50 --side 224 --batch 128 --precision bf16|tf32|f32 [--nchw]
       [--checkpoint-blocks] [--eager] [--lock FILE]"""
import argparse, fcntl, json, time
import torch, torch.nn.functional as F, torchvision
from torch.utils.checkpoint import checkpoint
from torch_timing import time_steps

p = argparse.ArgumentParser()
p.add_argument("--depth", type=int, default=50)
p.add_argument("--side", type=int, default=224)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--classes", type=int, default=1000)
p.add_argument("--precision", default="bf16", choices=["bf16", "tf32", "f32"])
p.add_argument("--nchw", action="store_true")
p.add_argument("--checkpoint-blocks", action="store_true")
p.add_argument("--eager", action="store_true")
p.add_argument("--lock")
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
if a.checkpoint_blocks:
    for layer in (m.layer1, m.layer2, m.layer3, m.layer4):
        for blk in layer:
            blk.forward = (lambda f: lambda h: checkpoint(f, h, use_reentrant=False))(blk.forward)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
notes = []


def make_step(fwd):
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


compiled = not a.eager
step = make_step(m if a.eager else torch.compile(m))
t0 = time.time()
try:
    first_loss = step().item()
except Exception as e:  # torch.compile with checkpointed blocks failing: say so, run eager
    if a.eager:
        raise
    notes.append(f"torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); eager")
    compiled = False
    torch._dynamo.reset()
    step = make_step(m)
    first_loss = step().item()
compile_s = time.time() - t0
lock = open(a.lock, "w") if a.lock else None
if lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
step_ms, allocated, reserved, _ = time_steps(step)
last_loss = step().item()
if lock:
    fcntl.flock(lock, fcntl.LOCK_UN)
system = ("torch.compile" if compiled else "eager") + ("" if a.nchw else " channels_last")
system += " checkpointed blocks" if a.checkpoint_blocks else ""
print(json.dumps({"system": system, "depth": a.depth,
                  "side": a.side, "batch": a.batch, "precision": a.precision,
                  "step_ms": step_ms, "peak_bytes": allocated, "peak_mib": allocated / 2**20,
                  "reserved_mib": reserved / 2**20, "first_step_s": round(compile_s, 1),
                  "first_loss": first_loss, "last_loss": last_loss, "notes": notes}), flush=True)
