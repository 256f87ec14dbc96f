#!/usr/bin/env python3
"""Times PyTorch's matmuls on the GEMM shapes of Ingot's gpt2 step, to set beside Ingot's own
op-by-op profile (trainer/examples/cuda_profile.rs), strict f32 and TF32.

    python3 scripts/gemm_shapes.py

Each line: Ingot's cuBLAS (column-major) m n k batch and flags, then the row-major product it
computes and torch's median time for it (CUDA events, 20 runs after 5 warm-ups).
"""
import torch

# (m, n, k, batch, trans_first, trans_second) as cuda_profile prints them for gpt2.
SHAPES = [
    (768, 8192, 50304, 1, False, False), (50304, 8192, 768, 1, True, False),
    (768, 50304, 8192, 1, False, True), (768, 8192, 3072, 1, False, False),
    (768, 8192, 3072, 1, True, False), (3072, 8192, 768, 1, False, False),
    (3072, 8192, 768, 1, True, False), (768, 3072, 8192, 1, False, True),
    (3072, 768, 8192, 1, False, True), (2304, 8192, 768, 1, True, False),
    (768, 8192, 2304, 1, False, False), (768, 2304, 8192, 1, False, True),
    (1024, 1024, 64, 96, True, False), (1024, 1024, 64, 96, False, False),
    (64, 1024, 1024, 96, True, False), (1024, 64, 1024, 96, False, True),
    (64, 1024, 1024, 96, False, False), (64, 1024, 1024, 96, False, True),
    (768, 8192, 768, 1, True, False), (768, 8192, 768, 1, False, False),
    (768, 768, 8192, 1, False, True),
]


def operands(m, n, k, batch, t1, t2):
    # Column-major C (m x n) = op(F) op(S) is row-major C^T [n, m] = op(S)^T op(F)^T:
    # row-major A [n, k] (stored [k, n] if t2) times B [k, m] (stored [m, k] if t1).
    lead = (batch,) if batch > 1 else ()
    a = torch.randn(*lead, *((k, n) if t2 else (n, k)), device="cuda")
    b = torch.randn(*lead, *((m, k) if t1 else (k, m)), device="cuda")
    fa = (lambda x: x.transpose(-1, -2)) if t2 else (lambda x: x)
    fb = (lambda x: x.transpose(-1, -2)) if t1 else (lambda x: x)
    return a, b, fa, fb


def time_ms(f):
    for _ in range(5):
        f()
    ts = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        f()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return sorted(ts)[len(ts) // 2]


for tf32 in (False, True):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    total = 0.0
    print(f"== {'tf32' if tf32 else 'strict f32'} ({torch.cuda.get_device_name()})")
    for s in SHAPES:
        a, b, fa, fb = operands(*s)
        ms = time_ms(lambda: torch.matmul(fa(a), fb(b)))
        total += ms
        m, n, k, batch, t1, t2 = s
        print(f"m={m} n={n} k={k} batch={batch} t1={t1} t2={t2}: {ms * 1e3:9.1f} us")
    print(f"sum of one of each: {total:.3f} ms")
