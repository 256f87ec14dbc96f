"""How the GPU scripts time a PyTorch training step (beside_torch.py, resnet_beside_torch.py):
`warmup` steps (torch.compile compiles in the first), then the median of `timed` steps, each
between two CUDA events, and the allocator's peaks over the timed steps."""
import statistics
import time

import torch


def time_steps(step, warmup=5, timed=20):
    """(median step ms, peak bytes allocated, peak bytes reserved, warm-up seconds)."""
    t = time.time()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm = time.time() - t
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(timed):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return (statistics.median(times), torch.cuda.max_memory_allocated(),
            torch.cuda.max_memory_reserved(), warm)
