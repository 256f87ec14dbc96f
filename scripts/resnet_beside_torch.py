"""torchvision's ResNet under torch.compile, as users run it, for `ingot train --model
resnet:depth=D,side=S,batch=B` beside it (issue 48), on the GPU machine: default mode,
cudnn.benchmark on, channels_last (or NCHW), forward and loss under bf16 autocast (or f32 with
TF32 on or off), SGD (lr 0.1, momentum 0.9, weight decay 5e-4, as Ingot's resnet) on a fixed random batch. 5 warm-up steps, then the
median of 20 timed steps (CUDA events around each), and torch.cuda.max_memory_allocated()
over the timed steps. One JSON line per run.

--mode M passes torch.compile's mode (e.g. reduce-overhead: the compiled forward and backward
replayed as CUDA graphs; max-autotune). Without it, torch.compile's default mode. Under
reduce-overhead the graphs' memory pool is taken in the warm-up steps, so the peak allocated
over the timed steps leaves it out: read reserved_mib there.

--checkpoint-blocks (issue 51) wraps every residual block of layer1..layer4 (a Bottleneck or
BasicBlock) in torch.utils.checkpoint (non-reentrant, as PyTorch recommends), the usual
practice under a memory limit: only the blocks' inputs are kept, and each block's forward runs
again in the backward pass. torch.compile compiles the checkpointed model as users write it;
if that fails, the step runs eager (and the line says so, with the error). --eager runs
without torch.compile. As in PyTorch, a checkpointed block's recomputation updates batch
norm's running statistics a second time (they are not read by a training step).

--lock FILE: the first step (the compile) runs at once, then the allocator's cache is emptied
(so that a process waiting its turn holds little device memory), FILE named by --ready is
written (the compile's seconds), and the warm-up and timed steps wait for an exclusive flock on
FILE, so that several of these processes can compile at the same time on one machine and still
time their steps one at a time (a driver holding the lock decides when).

--find-max-batch (issue 48's "largest batch that fits 80 GiB", PyTorch's side, found by
trying): the model is compiled at --batch with the batch axis marked dynamic (one compile for
every batch tried; the line counts dynamo's compiled graphs), then, under the lock, the process
is held to --limit-gib by torch.cuda.set_per_process_memory_fraction and the batch is doubled
from --search-start until two steps in a row fail (out of memory, caught: the cache emptied),
then bisected to within --tolerance (scripts/batch_search.py). The line gives every trial
(batch, fit, peak allocated, seconds). --search-seconds bounds the search: when it runs out the
line says so and gives the bounds reached.

--device cpu runs the same logic on the CPU with tiny sizes (to test the script without a GPU:
wall-clock timing, no memory figures; --find-max-batch there needs --cpu-bytes-per-sample, a
stand-in for the allocator's limit).
usage: resnet_beside_torch.py --depth 50 --side 224 --batch 128 --precision bf16|tf32|f32 [--nchw]
       [--mode reduce-overhead] [--checkpoint-blocks] [--eager] [--lock FILE [--ready FILE]]
       [--find-max-batch [--limit-gib 80] [--search-start 256] [--tolerance 0.05]]"""
import argparse, fcntl, gc, json, os, statistics, sys, time
import torch, torch.nn.functional as F, torchvision
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batch_search import largest_fitting  # noqa: E402
from torch_timing import time_steps  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--depth", type=int, default=50, choices=[18, 34, 50, 101, 152])
p.add_argument("--side", type=int, default=224)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--classes", type=int, default=1000)
p.add_argument("--precision", default="bf16", choices=["bf16", "tf32", "f32"])
p.add_argument("--nchw", action="store_true")
p.add_argument("--mode", help="torch.compile's mode (default: torch.compile's default)")
p.add_argument("--checkpoint-blocks", action="store_true")
p.add_argument("--eager", action="store_true")
p.add_argument("--lock")
p.add_argument("--ready", help="with --lock: written once the compile is done")
p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
p.add_argument("--find-max-batch", action="store_true")
p.add_argument("--limit-gib", type=float, default=80.0)
p.add_argument("--search-start", type=int, default=256)
p.add_argument("--tolerance", type=float, default=0.05)
p.add_argument("--search-seconds", type=float, default=1e9)
p.add_argument("--cpu-bytes-per-sample", type=float)
a = p.parse_args()
if a.batch < 1 or a.side < 32 or a.classes < 1:
    p.error("--batch and --classes must be at least 1, --side at least 32")
if a.ready and not a.lock:
    p.error("--ready needs --lock")
if a.mode and a.eager:
    p.error("--mode is torch.compile's: not with --eager")
if a.find_max_batch and a.device == "cpu" and not a.cpu_bytes_per_sample:
    p.error("--find-max-batch on the CPU needs --cpu-bytes-per-sample")
if a.find_max_batch and a.checkpoint_blocks:
    p.error("--find-max-batch runs the plain step (no --checkpoint-blocks)")
dev = a.device
cuda = dev == "cuda"
if cuda:
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
torch.manual_seed(0)
m = getattr(torchvision.models, f"resnet{a.depth}")(num_classes=a.classes).to(dev).train()
fmt = torch.contiguous_format if a.nchw else torch.channels_last
if not a.nchw:
    m = m.to(memory_format=torch.channels_last)


def batch(n):
    """A random batch of n images (in the model's layout) and labels."""
    xb = torch.randn(n, 3, a.side, a.side, device=dev).contiguous(memory_format=fmt)
    yb = torch.randint(0, a.classes, (n,), device=dev)
    if mark_dynamic:
        torch._dynamo.mark_dynamic(xb, 0)
        torch._dynamo.mark_dynamic(yb, 0)
    return xb, yb


mark_dynamic = a.find_max_batch and not a.eager
x, y = batch(a.batch)
if a.checkpoint_blocks:
    for layer in (m.layer1, m.layer2, m.layer3, m.layer4):
        for blk in layer:
            blk.forward = (lambda f: lambda h: checkpoint(f, h, use_reentrant=False))(blk.forward)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
notes = []


def make_step(fwd):
    def step(xb=None, yb=None):
        xb = x if xb is None else xb
        yb = y if yb is None else yb
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = F.cross_entropy(fwd(xb), yb)
        loss.backward()
        opt.step()
        return loss

    return step


def compiled_graphs():
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # an internal counter: absent in some versions
        return None


def cpu_time_steps(step, warmup=2, timed=5):
    """The CPU stand-in of torch_timing.time_steps (wall clock, no memory figures)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(timed):
        t = time.perf_counter()
        step()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), None, None, None


compiled = not a.eager
step = make_step(m if a.eager else torch.compile(m, mode=a.mode))
t0 = time.time()
try:
    first_loss = step().item()
except Exception as e:  # torch.compile failing (with checkpointed blocks): say so, run eager
    if a.eager:
        raise
    why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    torch._dynamo.reset()
    if mark_dynamic:  # the batch axis would not stay dynamic: compile per batch instead
        notes.append(f"torch.compile with a dynamic batch failed ({why}); compiled per batch")
        mark_dynamic = False
        x, y = batch(a.batch)
        step = make_step(torch.compile(m, mode=a.mode))
    else:
        notes.append(f"torch.compile failed ({why}); eager")
        compiled = False
        step = make_step(m)
    first_loss = step().item()
compile_s = time.time() - t0
lock = open(a.lock, "w") if a.lock else None
if lock:
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    if a.ready:
        with open(a.ready + ".tmp", "w") as f:
            f.write(f"{compile_s:.1f}\n")
        os.replace(a.ready + ".tmp", a.ready)
    fcntl.flock(lock, fcntl.LOCK_EX)
system = ("torch.compile" if compiled else "eager") + ("" if a.nchw else " channels_last")
system += f" mode={a.mode}" if a.mode else ""
system += " checkpointed blocks" if a.checkpoint_blocks else ""
out = {"system": system, "depth": a.depth, "side": a.side, "batch": a.batch,
       "precision": a.precision, "device": dev, "first_step_s": round(compile_s, 1),
       "first_loss": first_loss}


def is_oom(e):
    if isinstance(e, torch.OutOfMemoryError):
        return True
    s = str(e)
    return "out of memory" in s or "CUDNN_STATUS_ALLOC_FAILED" in s or "CUBLAS_STATUS_ALLOC_FAILED" in s


class TimeUp(Exception):
    pass


class NotOom(Exception):
    """A trial failing other than by running out of memory: the search stops there."""


def find_max_batch():
    """Doubling then bisecting under the limit; every trial two steps at its batch."""
    limit = int(a.limit_gib * 2**30)
    info = {"limit_bytes": limit, "dynamic_batch": mark_dynamic}
    if cuda:
        total = torch.cuda.get_device_properties(0).total_memory
        free, _ = torch.cuda.mem_get_info()
        info.update(device_total_bytes=total, device_free_bytes_at_start=free)
        if free < limit:
            notes.append(f"only {free} bytes free on the device at the start, under the limit {limit}")
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total))
    graphs0 = compiled_graphs()
    deadline = time.time() + a.search_seconds
    log = []

    def fits(n):
        if time.time() > deadline:
            raise TimeUp()
        t = time.time()
        peak, ok, err = None, False, None
        xb = yb = None
        try:
            xb, yb = batch(n)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            for _ in range(2):
                loss = step(xb, yb)
            ok = bool(torch.isfinite(loss).item())
            if cuda:
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated()
            elif n * a.cpu_bytes_per_sample > limit:
                ok = False
                err = "over --cpu-bytes-per-sample's stand-in limit"
            if not ok and err is None:
                err = "non-finite loss"
        except Exception as e:
            if not is_oom(e):
                raise NotOom(f"batch {n}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            err = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        finally:
            del xb, yb
            opt.zero_grad(set_to_none=True)
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        log.append({"batch": n, "fit": ok, "peak_bytes": peak, "seconds": round(time.time() - t, 1),
                    **({"error": err} if err else {})})
        print(json.dumps({"trial": log[-1]}), flush=True)
        return ok

    try:
        lo, hi, _ = largest_fitting(fits, start=a.search_start, tolerance=a.tolerance)
        info["finished"] = True
    except (TimeUp, NotOom) as e:
        ok = [t["batch"] for t in log if t["fit"]]
        bad = [t["batch"] for t in log if not t["fit"]]
        lo, hi = max(ok, default=0), min(bad, default=None)
        info["finished"] = False
        why = "--search-seconds ran out" if isinstance(e, TimeUp) else f"a trial failed ({e})"
        notes.append(f"{why}: the bounds reached are {lo} and {hi}")
    graphs1 = compiled_graphs()
    info.update(largest_batch=lo, first_failed_batch=hi, trials=log)
    if graphs0 is not None and graphs1 is not None:
        info["graphs_compiled_during_search"] = graphs1 - graphs0
        info["graphs_compiled_in_all"] = graphs1
    return info


if a.find_max_batch:
    out["system"] += " find-max-batch"
    out["find_max_batch"] = find_max_batch()
else:
    step_ms, allocated, reserved, _ = (time_steps if cuda else cpu_time_steps)(step)
    out.update(step_ms=step_ms, peak_bytes=allocated,
               peak_mib=allocated / 2**20 if allocated else None,
               reserved_mib=reserved / 2**20 if reserved else None,
               last_loss=step().item())
if lock:
    fcntl.flock(lock, fcntl.LOCK_UN)
out["notes"] = notes
print(json.dumps(out), flush=True)
