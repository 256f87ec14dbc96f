"""Times PyTorch's own stem convolution (resnet50 at 224, batch 128, bf16): its forward and
its filter gradient alone (`torch.ops.aten.convolution_backward` with only the weight's
gradient asked for), NCHW and channels_last, with the input's 3 channels as given and padded
with zero channels to 4 and 8, cudnn.benchmark on and off; then the kernels the channels_last
filter gradient launches (torch.profiler). Issue 48: what makes PyTorch's stem fast.

    python3 scripts/torch_stem_probe.py [N]
"""
import sys
import torch

N = int(sys.argv[1]) if len(sys.argv) > 1 else 128
dev = "cuda"
torch.manual_seed(0)


def timed(f, reps=10):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        f()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e) * 1000)
    out.sort()
    return out[len(out) // 2]


def case(c, fmt, bench):
    torch.backends.cudnn.benchmark = bench
    x = torch.randn(N, c, 224, 224, device=dev, dtype=torch.bfloat16)
    w = torch.randn(64, c, 7, 7, device=dev, dtype=torch.bfloat16) * 0.1
    if fmt == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
        w = w.contiguous(memory_format=torch.channels_last)
    y = torch.nn.functional.conv2d(x, w, stride=2, padding=3)
    dy = torch.randn_like(y)
    fwd = lambda: torch.nn.functional.conv2d(x, w, stride=2, padding=3)
    bwd = lambda: torch.ops.aten.convolution_backward(
        dy, x, w, None, [2, 2], [3, 3], [1, 1], False, [0, 0], 1, [False, True, False])
    print(f"C={c} {fmt:13s} benchmark={bench!s:5s}: forward {timed(fwd):8.1f} us, "
          f"filter gradient {timed(bwd):8.1f} us  (y {tuple(y.shape)} strides {y.stride()})")
    return bwd


print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.get_device_name())
last = None
for bench in [True]:
    for c in [3, 4, 8]:
        for fmt in ["nchw", "channels_last"]:
            b = case(c, fmt, bench)
            if c == 3 and fmt == "channels_last" and bench:
                last = b
from torch.profiler import profile, ProfilerActivity
torch.backends.cudnn.benchmark = True
with profile(activities=[ProfilerActivity.CUDA]) as p:
    for _ in range(3):
        last()
    torch.cuda.synchronize()
print(p.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=110))
