#!/usr/bin/env python3
"""Side-by-side GPU benchmark of the reference training steps: Ingot, PyTorch eager,
PyTorch torch.compile and JAX jit, on the models of reference-models.md.

    python3 scripts/gpu_bench.py --ingot target/release/ingot \\
        [--models mlp gpt-mini gpt2] [--modes f32 tf32 bf16] \\
        [--systems ingot torch-eager torch-compile jax] \\
        [--steps 50] [--warmup 10] [--timeout 300] [--json OUT.json] [--batch N]

Every (model, system, mode) cell runs in a fresh subprocess, so each system's device memory is
measured alone and a crash, an out-of-memory or a timeout of one cell only marks that cell as
failed. A cell runs `warmup` steps, then `steps` timed ones, and reports the median step time
and the peak device memory. Progress goes to stderr as cells finish; the JSON file (if asked
for) is rewritten after every cell, so a run cut short still leaves what it measured. At the
end a table goes to stdout:

    | model | system | peak MiB | step ms (f32) | step ms (tf32) | step ms (bf16) |

What is measured, per system:
  torch-eager, torch-compile  the models of scripts/torch_reference.py on cuda, float32, plain
      attention (not SDPA); SGD lr 0.1 (mlp), AdamW lr 3e-4 wd 0.01 (gpt) with PyTorch's default
      foreach implementation. A step is zero_grad(set_to_none=True), forward + loss, backward,
      opt.step(). torch-compile compiles the forward+loss (torch.compile, default mode) and
      opt.step (falls back to the eager opt.step, with a note, if that fails). Time: per step,
      synchronize, wall clock around the step, synchronize (CUDA-event times are kept too).
      Peak: torch.cuda.max_memory_allocated() over the timed steps (reset after warmup), so
      resident state (params, grads, moments, batch) is included.
  jax  scripts/jax_reference.py: jax.jit(step, donate_argnums=(params, opt_state)), compiled
      ahead of time; XLA_PYTHON_CLIENT_PREALLOCATE=false. Time: block_until_ready per step.
      Peak: memory_stats()["peak_bytes_in_use"] (JAX cannot reset it, so it covers the whole
      process, compilation and autotuning included); bytes_in_use and the compiled step's
      memory_analysis() (temp size, ...) are kept as well.
  ingot  `INGOT train --model M --device cuda --steps W+N --json [--tf32]`; the step time is the
      median of the per-step "seconds" after the warmup, the peak its summary's measured_bytes.

Models: mlp, gpt-mini, gpt2, gpt2-medium (d_model 1024, 24 layers, 16 heads), gpt-1.3b (d_model
2048, 24 layers, 16 heads), or any gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=..
shape; `--batch N` runs every GPT at batch N (each becomes its gpt: spec with batch=N, for every
system alike). Each GPT cell also reports the step's model FLOPs (the forward and backward
products, counted as Ingot's `flops::model` counts them: 6 per weight and token for the weight
matrices, the causal attention's 2·T·d per token and layer forward and 2.5 times that backward)
and TFLOP/s: those FLOPs over the cell's median step time, the same count for every system; an
Ingot cell's summary gives its own count, and a note says if the two differ. A second table after
the first gives them: | model | system | mode | step ms | TFLOP/s | peak MiB |.

Environment: INGOT_BENCH_ARGS adds arguments to every ingot cell's command (`--budget 4GiB`,
`--chunk-loss-head`); TORCH_BENCH_CHECKPOINT=1 wraps every transformer block of the torch cells
in torch.utils.checkpoint (non-reentrant), the usual practice under a memory limit;
TORCH_BENCH_LOCK=FILE makes a torch cell take an exclusive flock on FILE after its first step
(the compile) and hold it over its other steps, so that other programs of one device call that
take the same lock (resnet_beside_torch.py --lock, `flock FILE ingot run ...`) compile at the same
time and still run their timed steps one at a time.

torch and jax cells start from the same parameters and batch (numpy, seeded per tensor, with
reference-models.md's init: weights normal(0, 0.02), biases 0, LayerNorm gains 1), so their
first and last losses must agree; the footer says whether they do. Ingot uses its own seeded init.

f32 mode: no TF32 anywhere (torch: allow_tf32 False; jax: matmul precision "highest"; ingot:
no --tf32). tf32 mode: torch allow_tf32 True, jax "tensorfloat32", ingot --tf32. bf16 mode: the
torch step's forward and loss under torch.autocast(dtype=torch.bfloat16) (f32 weights and
optimizer, TF32 on for what autocast leaves in f32), ingot --precision bf16; jax has no bf16
cell (it is marked as not run).

Times are per step, synchronised before and after (torch: torch.cuda.synchronize; jax:
block_until_ready), so they include the host's launch work: what a training loop sees. Ingot's
are its per-step "wall_seconds" (graph launch, the step, the loss's copy to the host), the same
basis; its device time (CUDA events, "seconds") is kept as device_median_ms.

The JSON file: {"meta": {date, gpu {name, driver, memory_mib, count}, versions {torch, jax, ...},
steps, warmup, timeout_s, seed, argv, env}, "cells": [{model, system, mode, steps_run, ok,
error (when not ok), command, returncode, wall_seconds, stderr_tail, result: {median_ms, step_ms
[each timed step], peak_bytes, first_loss, last_loss, notes [...], device, and per system:
torch: resident_bytes, peak_reserved_bytes, event_median_ms, event_ms, graph_breaks; jax:
bytes_in_use, resident_bytes, memory_analysis {temp_size_in_bytes, argument_size_in_bytes,
...}, compile_seconds; ingot: planned_bytes, context_bytes, summary {its whole summary}}}],
"loss_checks": [{model, system, mode, which (first|last), loss, torch_eager_loss, rel_diff,
tol, ok}]}.

Where one command may run only so long (a lent GPU machine's 10 minutes), run a model or two
per command, each with its own --json, then print one table of them all, with no GPU:
    python3 scripts/gpu_bench.py --table a.json b.json

Exit status: 0 when every cell ran (and the torch/jax losses agree), 1 when some cell failed or
some losses disagree, 2 on a usage error or no GPU, 130 when interrupted (SIGINT or SIGTERM: the
cell in flight is killed, and the table of the cells so far is still printed).
`--device cpu` runs the torch and jax cells on the CPU, only to test this script on a machine
without a GPU (the timings then mean nothing).
"""

import argparse
import ctypes
import datetime
import fcntl
import importlib.metadata
import json
import math
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
import traceback
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEMS = ["ingot", "torch-eager", "torch-compile", "jax"]
# Also available (--systems): PyTorch torch.compile with fused attention (SDPA), and Ingot with its
# attention fusion off (the plain attention the other columns compute).
EXTRA_SYSTEMS = ["torch-compile-sdpa", "ingot-plain"]
MODES = ["f32", "tf32", "bf16"]
MODELS = ["mlp", "gpt-mini", "gpt2"]
# The named GPTs (models/src/gpt.rs, scripts/torch_reference.py): name -> shape.
GPT_KEYS = ["vocab", "d_model", "layers", "heads", "d_ff", "seq", "batch"]
NAMED_GPTS = {
    "gpt-mini": dict(vocab=8192, d_model=512, layers=4, heads=8, d_ff=2048, seq=256, batch=16),
    "gpt2": dict(vocab=50304, d_model=768, layers=12, heads=12, d_ff=3072, seq=1024, batch=8),
    "gpt2-medium": dict(vocab=50304, d_model=1024, layers=24, heads=16, d_ff=4096, seq=1024, batch=8),
    "gpt-1.3b": dict(vocab=50304, d_model=2048, layers=24, heads=16, d_ff=8192, seq=1024, batch=8),
}
LABELS = {
    "ingot": "Ingot",
    "torch-eager": "PyTorch eager",
    "torch-compile": "PyTorch torch.compile",
    "torch-compile-sdpa": "PyTorch torch.compile + SDPA",
    "ingot-plain": "Ingot, attention unfused",
    "jax": "JAX jit (XLA)",
}
MiB = 1024 * 1024


def log(msg):
    """Progress to stderr, flushed at once so that a run killed at a wall-clock limit keeps it."""
    print(f"gpu_bench: {msg}", file=sys.stderr, flush=True)


# =================================================================================================
# Worker side: one cell, in its own process. Its last stdout line is one JSON object.
# =================================================================================================


def reference_init(shapes, seed):
    """{name: float32 numpy array}: reference-models.md's default init (weights normal(0, 0.02),
    biases zero, LayerNorm gains one). Each tensor has its own generator, seeded from the seed
    and its name, so torch and jax (whose parameter orders differ) get the same numbers."""
    import numpy as np

    out = {}
    for name, shape in shapes.items():
        if name.endswith(".bias"):
            out[name] = np.zeros(shape, np.float32)
        elif re.search(r"(^|\.)ln[^.]*\.weight$", name):
            out[name] = np.ones(shape, np.float32)
        else:
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            out[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    return out


def synthetic_batch(cfg, seed):
    """(x, y) as numpy: mlp x normal [256, 784] f32 and labels in 0..10; gpt ids in 0..vocab."""
    import numpy as np

    rng = np.random.default_rng([seed, 0xBA7C4])
    if cfg is None:
        x = rng.standard_normal((256, 784), dtype=np.float32)
        y = rng.integers(0, 10, size=(256,), dtype=np.int64)
    else:
        shape = (cfg["batch"], cfg["seq"])
        x = rng.integers(0, cfg["vocab"], size=shape, dtype=np.int64)
        y = rng.integers(0, cfg["vocab"], size=shape, dtype=np.int64)
    return x, y


def torch_cell(a):
    """torch-eager / torch-compile: {"median_ms", "peak_bytes", "first_loss", ...}."""
    import torch

    sys.path.insert(0, HERE)
    sys.dont_write_bytecode = True  # no scripts/__pycache__ left in the checkout
    import torch_reference as tr

    def fail(msg):  # torch_reference's own fail() exits; here the reason goes to the table
        raise CellError(msg)

    tr.fail = fail
    notes = []
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise CellError("torch sees no CUDA device")
    tf32 = a.mode in ("tf32", "bf16")
    autocast = a.mode == "bf16"
    # The legacy switches, as the brief of this benchmark (and most PyTorch code) sets them.
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    notes.append(f"float32_matmul_precision={torch.get_float32_matmul_precision()}")
    device = torch.device(a.device)
    compiled = a.worker in ("torch-compile", "torch-compile-sdpa")
    tr.ATTENTION = "sdpa" if a.worker == "torch-compile-sdpa" else "plain"
    notes.append(f"attention={tr.ATTENTION}")

    def setup():
        model, make_optimizer = tr.build(a.model, foreach=None)  # PyTorch's default optimizer
        cfg = tr.gpt_config(a.model)
        state = reference_init({k: tuple(v.shape) for k, v in model.state_dict().items()}, a.seed)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
        model.to(device=device, dtype=torch.float32).train()
        if os.environ.get("TORCH_BENCH_CHECKPOINT") == "1":
            # The usual practice under a memory limit: torch.utils.checkpoint around every
            # transformer block (non-reentrant, as PyTorch recommends), so each block's
            # activations are recomputed in the backward pass.
            from torch.utils.checkpoint import checkpoint

            for blk in model.blocks:
                blk.forward = (lambda f: lambda h: checkpoint(f, h, use_reentrant=False))(blk.forward)
            if "checkpointed blocks" not in notes:
                notes.append("checkpointed blocks")
        xn, yn = synthetic_batch(cfg, a.seed)
        x = torch.from_numpy(xn).to(device)
        y = torch.from_numpy(yn).to(device)
        return model, make_optimizer(model.parameters()), x, y

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def run(compile_opt):
        model, opt, x, y = setup()
        forward = torch.compile(model) if compiled else model
        opt_step = opt.step
        if compile_opt:
            # As PyTorch's "Compiling the optimizer with torch.compile" recipe does it.
            @torch.compile
            def opt_step():
                opt.step()

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = forward(x, y)
            loss.backward()
            try:
                opt_step()
            except Exception as e:
                if compile_opt:
                    raise OptStepCompileError() from e
                raise
            return loss

        wall, event, first, loss = [], [], None, None
        lock = None
        try:
            for i in range(a.warmup + a.steps):
                if i == 1 and os.environ.get("TORCH_BENCH_LOCK"):
                    lock = open(os.environ["TORCH_BENCH_LOCK"], "w")
                    fcntl.flock(lock, fcntl.LOCK_EX)
                first, loss = timed_step(i, step, wall, event, first)
            last = loss.item()
        finally:
            if lock:
                lock.close()  # releases the flock
        return wall, event, first, last

    def timed_step(i, step, wall, event, first):
        """Step `i` of a run: (the first step's loss, this step's loss)."""
        sync()
        if i == a.warmup and cuda:
            # Peak over the timed steps only; what is resident now (params, grads, moments,
            # batch) stays counted, since max_memory_allocated starts from the current use.
            torch.cuda.reset_peak_memory_stats()
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        loss = step()
        if cuda:
            e1.record()
        sync()
        t1 = time.perf_counter()
        if i == 0:
            first = loss.item()
        if i >= a.warmup:
            wall.append((t1 - t0) * 1e3)
            if cuda:
                event.append(e0.elapsed_time(e1))
        return first, loss

    try:
        wall, event, first, last = run(compile_opt=compiled)
    except OptStepCompileError as wrapper:
        # torch.compile(opt.step) is what PyTorch recommends, but it is the newer, less trodden
        # path; if it fails, time the compiled model with the eager optimizer step, and say so.
        # Everything is built anew: the failed call may have left the optimizer half updated.
        e = wrapper.__cause__
        notes.append(f"torch.compile(opt.step) failed ({type(e).__name__}: {first_line(e)}); eager opt.step used")
        traceback.print_exception(e, file=sys.stderr)
        torch._dynamo.reset()
        if cuda:
            torch.cuda.empty_cache()
        wall, event, first, last = run(compile_opt=False)
    else:
        if compiled:
            notes.append("forward+loss and opt.step compiled")
    graph_breaks = {}
    if compiled:
        # A graph break makes dynamo run part of the code eagerly, silently: count them. The
        # optimizer's own torch._dynamo.graph_break() calls (around step(), on purpose, see
        # torch/optim/optimizer.py) are expected; others are noted.
        try:
            from torch._dynamo.utils import counters

            graph_breaks = {k.strip().splitlines()[0][:200]: v for k, v in counters["graph_break"].items()}
            other = [k for k in graph_breaks if "graph_break()" not in k]
            if other:
                notes.append(f"{sum(graph_breaks[k] for k in other)} unexpected dynamo graph break(s): {'; '.join(other[:3])}")
        except Exception as e:
            notes.append(f"could not read dynamo's graph-break counters: {first_line(e)}")

    out = {
        "median_ms": statistics.median(wall),
        "step_ms": wall,
        "first_loss": first,
        "last_loss": last,
        "notes": notes,
        "torch": torch.__version__,
        "graph_breaks": graph_breaks,
    }
    if cuda:
        out.update(
            peak_bytes=torch.cuda.max_memory_allocated(),
            resident_bytes=torch.cuda.memory_allocated(),  # params, grads, moments, batch
            peak_reserved_bytes=torch.cuda.max_memory_reserved(),
            event_median_ms=statistics.median(event),
            event_ms=event,
            device=torch.cuda.get_device_name(),
        )
    else:
        out.update(peak_bytes=None, device="cpu")
        notes.append("cpu: no device peak")
    return out


def jax_cell(a):
    """jax: {"median_ms", "peak_bytes", "first_loss", "memory_analysis", ...}."""
    # Allocate on demand, so that the peak is what the step needs (the parent sets this too).
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    import jax
    import numpy as np

    sys.path.insert(0, HERE)
    sys.dont_write_bytecode = True  # no scripts/__pycache__ left in the checkout
    import jax_reference as jr

    notes = []
    try:
        jax.config.update("jax_platforms", "cuda" if a.device == "cuda" else "cpu")
        dev = jax.devices()[0]
    except RuntimeError as e:
        raise CellError(f"JAX finds no {a.device} device: {first_line(e)}")
    # JAX on a recent GPU may use TF32 for f32 products by default: say which one we mean.
    precision = "tensorfloat32" if a.mode == "tf32" else "highest"
    jax.config.update("jax_default_matmul_precision", precision)
    notes.append(f"jax_default_matmul_precision={precision}")

    cfg = jr.config(a.model)
    params = {k: jax.device_put(v, dev) for k, v in reference_init(jr.param_shapes(cfg), a.seed).items()}
    xn, yn = synthetic_batch(cfg, a.seed)
    x = jax.device_put(xn.astype(np.float32 if cfg is None else np.int32), dev)
    y = jax.device_put(yn.astype(np.int32), dev)
    opt_state = jr.init_opt_state(cfg, params)

    t0 = time.perf_counter()
    compiled = jr.make_step(cfg).lower(params, opt_state, x, y).compile()
    compile_s = time.perf_counter() - t0
    analysis = None
    try:
        ma = compiled.memory_analysis()
        if ma is not None:
            analysis = {k: getattr(ma, k) for k in dir(ma) if k.endswith("_in_bytes")}
    except Exception as e:  # not every backend / version has it
        notes.append(f"memory_analysis() unavailable: {first_line(e)}")

    times, first, loss, resident = [], None, None, None
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            stats = dev.memory_stats() or {}
            resident = stats.get("bytes_in_use")
        t0 = time.perf_counter()
        params, opt_state, loss = compiled(params, opt_state, x, y)
        # All outputs of one XLA execution become ready together; waiting on the loss waits for
        # the updated parameters too, without walking hundreds of leaves every step.
        loss.block_until_ready()
        t1 = time.perf_counter()
        if i == 0:
            first = float(loss)
        if i >= a.warmup:
            times.append((t1 - t0) * 1e3)
    jax.block_until_ready((params, opt_state))
    stats = dev.memory_stats() or {}
    out = {
        "median_ms": statistics.median(times),
        "step_ms": times,
        "first_loss": first,
        "last_loss": float(loss),
        "peak_bytes": stats.get("peak_bytes_in_use"),
        "bytes_in_use": stats.get("bytes_in_use"),
        "resident_bytes": resident,
        "memory_analysis": analysis,
        "compile_seconds": compile_s,
        "notes": notes,
        "device": str(getattr(dev, "device_kind", dev)),
        "jax": jax.__version__,
    }
    if not stats:
        notes.append(f"{a.device}: no memory_stats()")
    return out


class CellError(Exception):
    """A cell that cannot run, with a reason meant for the table."""


class OptStepCompileError(Exception):
    """The compiled optimizer step failed (its cause is the error)."""


def first_line(e):
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else type(e).__name__


def worker_main(a):
    try:
        if a.worker == "jax":
            out = jax_cell(a)
        else:
            out = torch_cell(a)
        out["ok"] = True
        bad = [k for k in ("first_loss", "last_loss") if out.get(k) is None or not math.isfinite(out[k])]
        if bad:
            out["notes"].append(f"non-finite {' and '.join(bad)}")
        code = 0
    except BaseException as e:  # report everything (OOM, compile errors, ...) as the cell's reason
        if not isinstance(e, CellError):
            traceback.print_exc(file=sys.stderr)
        reason = f"{type(e).__name__}: {first_line(e)}" if not isinstance(e, CellError) else str(e)
        if "out of memory" in str(e).lower() or "RESOURCE_EXHAUSTED" in str(e):
            reason = "out of memory: " + reason
        out, code = {"ok": False, "error": reason}, 1
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    sys.stdout.flush()
    return code


# =================================================================================================
# Parent side: runs the cells, prints progress and the table, writes the JSON.
# =================================================================================================


def set_pdeathsig():
    """In the child: die with the parent (SIGKILL), so a benchmark killed at a wall-clock limit
    leaves no cell holding the GPU. Best effort (Linux only)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


CURRENT = {"proc": None}


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_subprocess(cmd, env, timeout):
    """(rc, stdout, stderr, seconds, timed_out); the child and everything it starts (e.g.
    torch.compile's compile workers) get their own process group, killed on timeout. A process
    group, not a new session: a session would outlive a device run that is cut off."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        errors="replace",
        process_group=0,
        preexec_fn=set_pdeathsig,
    )
    CURRENT["proc"] = p
    timed_out = False
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(p)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a grandchild outside the group keeps a pipe open
            p.kill()
            out, err = "", "(output lost: a process outside the cell's group kept its pipes open)"
    except BaseException:
        # Ctrl-C (or SIGTERM, see on_sigterm) reaches only our own process group, not the
        # cell's: end the cell too before giving up.
        kill_group(p)
        p.wait()
        raise
    finally:
        CURRENT["proc"] = None
    return p.returncode, out or "", err or "", time.perf_counter() - t0, timed_out


def tail(text, n=6):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return "\n".join(lines[-n:])


def worker_cell(a, model, system, mode):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", system, "--model", model, "--mode", mode,
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--seed", str(a.seed), "--device", a.device]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    rc, out, err, seconds, timed_out = run_subprocess(cmd, env, a.timeout)
    cell = {"command": shlex.join(cmd), "returncode": rc, "wall_seconds": round(seconds, 2)}
    if timed_out:
        return dict(cell, ok=False, error=f"timeout after {a.timeout:g} s", stderr_tail=tail(err, 20))
    result = None
    lines = [l for l in out.strip().splitlines() if l.strip()]
    if lines:
        try:
            result = json.loads(lines[-1])
        except ValueError:
            result = None
    if not isinstance(result, dict):
        why = f"exited {rc} without a result" if rc >= 0 else f"killed by signal {-rc}"
        return dict(cell, ok=False, error=f"{why}: {tail(err, 3) or '(no stderr)'}", stderr_tail=tail(err, 20))
    if not result.pop("ok", False):
        return dict(cell, ok=False, error=result.get("error", "failed"), stderr_tail=tail(err, 20))
    return dict(cell, ok=True, result=result)


def parse_ingot(out, warmup, steps):
    """The result of `ingot train --json`'s stdout, or raises CellError. One JSON object per
    step {"step", "loss", "seconds"}, then one {"summary": {...}}; nothing else."""
    rows, summary, fitted = [], None, None
    for line in out.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise CellError(f"ingot printed a line that is not JSON: {line[:200]!r}")
        if not isinstance(obj, dict):
            raise CellError(f"ingot printed JSON that is not an object: {line[:200]!r}")
        if "summary" in obj:
            summary = obj["summary"]
        elif "fitted" in obj:  # --budget: what fitting the step to it did
            fitted = obj["fitted"]
        elif {"step", "loss", "seconds"} <= obj.keys():
            rows.append(obj)
        else:
            raise CellError(f"ingot printed an unexpected object: {line[:200]!r}")
    if len(rows) != warmup + steps:
        raise CellError(f"ingot printed {len(rows)} steps, expected {warmup + steps}")
    if summary is None or not isinstance(summary, dict):
        raise CellError("ingot printed no summary line ({\"summary\": {...}})")
    # The wall clock of each step (launch, the step, the loss's copy back), the same basis as
    # the torch and jax cells; the device's own time ("seconds", CUDA events) is kept beside it.
    timed = [float(r.get("wall_seconds", r["seconds"])) * 1e3 for r in rows[warmup:]]
    device_ms = [float(r["seconds"]) * 1e3 for r in rows[warmup:]]
    notes = []
    peak = summary.get("measured_bytes")
    if peak is None:
        notes.append("no measured_bytes in the summary")
    losses = [float(r["loss"]) for r in rows]
    if not all(math.isfinite(v) for v in losses):
        notes.append("non-finite loss")
    if fitted is not None:
        notes.append("fitted: " + json.dumps(fitted, sort_keys=True))
    return {
        "median_ms": statistics.median(timed),
        "step_ms": timed,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "peak_bytes": peak,
        "planned_bytes": summary.get("planned_bytes"),
        "context_bytes": summary.get("context_bytes"),
        "ingot_median_step_seconds": summary.get("median_step_seconds"),
        "device_median_ms": statistics.median(device_ms),
        "device": summary.get("device"),
        "summary": summary,
        "notes": notes,
    }


def ingot_cell(a, model, mode, plain_attention=False):
    cmd = [a.ingot, "train", "--model", model, "--device", a.device, "--steps", str(a.warmup + a.steps),
           "--json", "--seed", str(a.seed), "--precision", mode]  # fmt: skip
    # Extra ingot arguments for every Ingot cell (`--budget 4GiB`, `--chunk-loss-head`).
    cmd += shlex.split(os.environ.get("INGOT_BENCH_ARGS", ""))
    if plain_attention:
        cmd.append("--no-fuse-attention")
    rc, out, err, seconds, timed_out = run_subprocess(cmd, dict(os.environ), a.timeout)
    cell = {"command": shlex.join(cmd), "returncode": rc, "wall_seconds": round(seconds, 2)}
    if timed_out:
        return dict(cell, ok=False, error=f"timeout after {a.timeout:g} s", stderr_tail=tail(err, 20))
    if rc != 0:
        why = f"exited {rc}" if rc > 0 else f"killed by signal {-rc}"
        return dict(cell, ok=False, error=f"{why}: {tail(err, 3) or '(no stderr)'}", stderr_tail=tail(err, 20))
    try:
        return dict(cell, ok=True, result=parse_ingot(out, a.warmup, a.steps))
    except CellError as e:
        return dict(cell, ok=False, error=str(e), stderr_tail=tail(err, 20), stdout_tail=tail(out, 5))


def gpt_shape(spec):
    """The shape (a dict of GPT_KEYS) of a GPT model name or gpt: spec; None for others."""
    if spec in NAMED_GPTS:
        return dict(NAMED_GPTS[spec])
    if spec.startswith("gpt:"):
        try:
            cfg = dict((k.strip(), int(v)) for k, v in (i.split("=", 1) for i in spec[4:].split(",") if i.strip()))
        except ValueError:
            return None
        return cfg if set(cfg) == set(GPT_KEYS) else None
    return None


def at_batch(spec, batch):
    """The gpt: spec of GPT `spec` at `batch` (what --batch runs), or None for a model that is not a GPT."""
    cfg = gpt_shape(spec)
    if cfg is None:
        return None
    cfg["batch"] = batch
    return "gpt:" + ",".join(f"{k}={cfg[k]}" for k in GPT_KEYS)


def gpt_model_flops(spec):
    """The model FLOPs of one training step of GPT `spec`, as Ingot's flops::model counts them
    (forward and backward products, recomputation left out); None for a model that is not a GPT."""
    cfg = gpt_shape(spec)
    if cfg is None:
        return None
    v, d, l, f, t, b = (cfg[k] for k in ("vocab", "d_model", "layers", "d_ff", "seq", "batch"))
    weights = l * (3 * d * d + d * d + 2 * d * f) + v * d
    attention_forward = l * 2 * t * d * b * t  # causal: half of q·kᵀ and p·v
    return 6 * weights * b * t + attention_forward + attention_forward * 5 // 2


def with_rate(model, result):
    """`result` with the step's model FLOPs and TFLOP/s over its median step (GPT models)."""
    flops = gpt_model_flops(model)
    if flops is None or not result.get("median_ms"):
        return result
    result["model_flops"] = flops
    result["tflops"] = flops / (result["median_ms"] * 1e-3) / 1e12
    own = (result.get("summary") or {}).get("model_flops")
    if own is not None and own != flops:
        result.setdefault("notes", []).append(f"ingot counts {own} model FLOPs, this script {flops}")
    return result


def model_error(spec):
    """Why a model name is not one the workers know, or None (checked before any cell runs)."""
    if spec in MODELS or spec in NAMED_GPTS:
        return None
    if not spec.startswith("gpt:"):
        return f"unknown model {spec!r}; known: mlp, gpt-mini, gpt2, gpt2-medium, gpt-1.3b, gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=.."
    keys = {"vocab", "d_model", "layers", "heads", "d_ff", "seq", "batch"}
    try:
        cfg = dict((k.strip(), int(v)) for k, v in (i.split("=", 1) for i in spec[4:].split(",") if i.strip()))
    except ValueError:
        return f"{spec!r}: a gpt model is gpt:key=integer,... with keys {', '.join(sorted(keys))}"
    if set(cfg) != keys:
        return f"{spec!r}: needs exactly the keys {', '.join(sorted(keys))}"
    return None


def version(pkg):
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def gpu_info():
    """{"name", "driver", "memory_mib"} from nvidia-smi, or None when there is no NVIDIA GPU.
    Asked of nvidia-smi, not of torch: the parent never touches the GPU itself."""
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi: {e}"
    rows = [l for l in r.stdout.strip().splitlines() if l.strip()]
    if r.returncode != 0 or not rows:
        return None, f"nvidia-smi exited {r.returncode}: {tail(r.stderr or r.stdout, 2)}"
    name, driver, mem = (s.strip() for s in rows[0].split(",")[:3])
    return {"name": name, "driver": driver, "memory_mib": mem, "count": len(rows)}, None


def mib(b):
    return f"{b / MiB:,.0f}" if b is not None else "?"


def ms(v):
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def peak_text(cell):
    r = cell["result"]
    text = mib(r.get("peak_bytes"))
    if cell["system"] == "jax" and r.get("memory_analysis") and r["memory_analysis"].get("temp_size_in_bytes") is not None:
        text += f" (temp {mib(r['memory_analysis']['temp_size_in_bytes'])})"
    if cell["system"] == "ingot" and r.get("planned_bytes") is not None:
        text += f" (planned {mib(r['planned_bytes'])})"
    return text


def table(cells, models, systems):
    """The markdown table, then footnotes for failures and notes, then the torch/jax loss check."""
    out = ["| model | system | peak MiB | step ms (f32) | step ms (tf32) | step ms (bf16) |", "|---|---|---|---|---|---|"]
    notes = []
    by = {(c["model"], c["system"], c["mode"]): c for c in cells}
    for model in models:
        for system in systems:
            row = [c for m in MODES if (c := by.get((model, system, m)))]
            if not row:
                continue
            peaks = []
            for c in row:
                if c["ok"]:
                    peaks.append((c["mode"], peak_text(c)))
            if not peaks:
                peak = "—"
            elif len({p for _, p in peaks}) == 1:
                peak = peaks[0][1]
            else:  # TF32 may change the kernels and so the workspace: show both
                peak = " / ".join(f"{p} ({m})" for m, p in peaks)
            cols = []
            for mode in MODES:
                c = by.get((model, system, mode))
                if c is None:
                    cols.append("—")  # not run
                elif c["ok"]:
                    text = ms(c["result"]["median_ms"])
                    for n in c["result"].get("notes") or []:
                        if n.startswith(("float32_matmul", "jax_default_matmul", "forward+loss and", "cpu:", "attention=")):
                            continue  # settings every cell of its kind has: in the JSON only
                        notes.append(f"[{len(notes) + 1}] {model} {system} {mode}: {n}")
                        text += f" [{len(notes)}]"
                    cols.append(text)
                else:
                    notes.append(f"[{len(notes) + 1}] {model} {system} {mode}: FAILED: {c['error']}")
                    cols.append(f"FAILED [{len(notes)}]")
            out.append(f"| {model} | {LABELS[system]} | {peak} | {' | '.join(cols)} |")
    out += [""] + notes if notes else []
    checks = loss_checks(cells)
    if checks:
        out += [""] + [c["text"] for c in checks]
    return "\n".join(out)


def loss_checks(cells):
    """torch and jax cells start from the same parameters and batch and run the same number of
    steps: their first losses (the forward pass) and last losses (after warmup + steps updates:
    the backward pass and the optimizer too) should agree with torch-eager's. The tolerances are
    loose for a sanity check: f32 runs agree to about 1e-6, TF32 ones to about 1e-3."""
    out = []
    by = {(c["model"], c["system"], c["mode"]): c for c in cells if c["ok"]}
    for (model, system, mode), c in sorted(by.items()):
        ref = by.get((model, "torch-eager", mode))
        if ref is None or system in ("ingot", "ingot-plain", "torch-eager"):
            continue
        for which, tol in (("first", 1e-4 if mode == "f32" else 1e-2), ("last", 1e-3 if mode == "f32" else 5e-2)):
            if which == "last" and (c.get("steps_run") is None or c.get("steps_run") != ref.get("steps_run")):
                continue  # cells of runs with other step counts (--table of several files)
            x, y = c["result"][which + "_loss"], ref["result"][which + "_loss"]
            rel = abs(x - y) / max(abs(y), 1e-12)
            ok = rel <= tol  # NaN compares false
            verdict = "agree" if ok else f"DISAGREE (more than {tol:g}; same init and batch: a bug in one of them?)"
            out.append({
                "model": model, "system": system, "mode": mode, "which": which, "loss": x,
                "torch_eager_loss": y, "rel_diff": rel, "tol": tol, "ok": ok,
                "text": f"{which} loss {model} {mode}: {system} {x:.6f} vs torch-eager {y:.6f} (rel {rel:.1e}) {verdict}",
            })  # fmt: skip
    return out


def write_json(path, doc):
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)  # a reader never sees half a file


def parent_main(a):
    if any(s.startswith("ingot") for s in a.systems):
        if not a.ingot:
            log("--ingot PATH is needed for the ingot cells (or leave ingot out of --systems)")
            return 2
        if not (os.path.isfile(a.ingot) and os.access(a.ingot, os.X_OK)):
            log(f"--ingot {a.ingot}: not an executable file (build it: cargo build --release -p ingot)")
            return 2
        a.ingot = os.path.abspath(a.ingot)
    for m in a.models:
        if (why := model_error(m)) is not None:
            log(why)
            return 2
    if a.batch is not None:
        if a.batch < 1:
            log("--batch must be at least 1")
            return 2
        if any(at_batch(m, a.batch) is None for m in a.models):
            log(f"--batch {a.batch}: only GPT models take a batch here, not {[m for m in a.models if at_batch(m, 1) is None]}")
            return 2
        a.models = [at_batch(m, a.batch) for m in a.models]
    if a.steps < 1 or a.warmup < 0 or a.timeout <= 0:
        log("--steps must be at least 1, --warmup at least 0 and --timeout positive")
        return 2
    if a.warmup < 2 and "torch-compile" in a.systems:
        log("note: torch.compile compiles during the first steps; with --warmup < 2 the timed steps include it")

    gpu = None
    if a.device == "cuda":
        gpu, why = gpu_info()
        if gpu is None:
            log(f"no NVIDIA GPU here ({why}); this benchmark needs one (--device cpu only tests the script)")
            return 2
        log(f"GPU: {gpu['name']}, driver {gpu['driver']}, {gpu['memory_mib']} MiB")

    doc = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": gpu,
            "device": a.device,
            "host": platform.node(),
            "python": platform.python_version(),
            "versions": {p: version(p) for p in ("torch", "triton", "jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "numpy")},
            "ingot": a.ingot,
            "argv": sys.argv,
            "steps": a.steps,
            "warmup": a.warmup,
            "timeout_s": a.timeout,
            "seed": a.seed,
            "env": {k: os.environ[k] for k in ("NVIDIA_TF32_OVERRIDE", "CUDA_VISIBLE_DEVICES", "XLA_FLAGS") if k in os.environ},
        },
        "cells": [],
        "loss_checks": [],
    }
    write_json(a.json, doc)

    plan = [(m, s, mode) for m in a.models for s in a.systems for mode in a.modes
            if not (s == "jax" and mode == "bf16")]  # no bf16 jax cell (see the docstring)
    interrupted = False
    for n, (model, system, mode) in enumerate(plan, 1):
        log(f"[{n}/{len(plan)}] {model} {system} {mode} ...")
        try:
            cell = (ingot_cell(a, model, mode, system == "ingot-plain") if system.startswith("ingot")
                    else worker_cell(a, model, system, mode))
        except KeyboardInterrupt:
            interrupted = True
            log("interrupted: the cells so far follow")
            break
        except OSError as e:  # could not start the process at all
            cell = {"ok": False, "error": f"could not start: {e}"}
        if cell.get("ok"):
            cell["result"] = with_rate(model, cell["result"])
        cell = {"model": model, "system": system, "mode": mode, "steps_run": a.warmup + a.steps, **cell}
        doc["cells"].append(cell)
        doc["loss_checks"] = loss_checks(doc["cells"])
        write_json(a.json, doc)
        if cell["ok"]:
            r = cell["result"]
            extra = "; ".join(r.get("notes") or [])
            rate = f", {r['tflops']:.1f} TFLOP/s" if r.get("tflops") else ""
            log(f"[{n}/{len(plan)}] {model} {system} {mode}: {ms(r['median_ms'])} ms{rate}, peak {mib(r.get('peak_bytes'))} MiB, "
                f"first loss {r['first_loss']:.6f} ({cell['wall_seconds']} s){'; ' + extra if extra else ''}")  # fmt: skip
        else:
            log(f"[{n}/{len(plan)}] {model} {system} {mode}: FAILED: {cell['error']}")
            if cell.get("stderr_tail"):
                print("    " + cell["stderr_tail"].replace("\n", "\n    "), file=sys.stderr, flush=True)

    print(f"\nsteps: {a.warmup} warmup + {a.steps} timed, median; GPU: {gpu['name'] if gpu else a.device}; "
          f"{doc['meta']['date']}", flush=True)  # fmt: skip
    print(table(doc["cells"], a.models, a.systems), flush=True)
    print(rate_table(doc["cells"]), flush=True)
    if a.json:
        log(f"raw numbers: {a.json}")
    if interrupted:
        return 130
    return 0 if all(c["ok"] for c in doc["cells"]) and all(c["ok"] for c in doc["loss_checks"]) else 1


def rate_table(cells):
    """| model | system | mode | step ms | TFLOP/s | peak MiB | of the cells that have a rate."""
    rows = ["| model | system | mode | step ms | TFLOP/s | peak MiB |", "|---|---|---|---:|---:|---:|"]
    for c in cells:
        r = c.get("result") or {}
        if c.get("ok") and r.get("tflops"):
            rows.append(f"| {c['model']} | {LABELS.get(c['system'], c['system'])} | {c['mode']} | {ms(r['median_ms'])} | "
                        f"{r['tflops']:.1f} | {mib(r.get('peak_bytes'))} |")  # fmt: skip
    return "\n" + "\n".join(rows) if len(rows) > 2 else ""


def table_main(paths):
    """--table: one table from the JSON files of earlier runs (e.g. one run per model, each
    inside a device's time limit); a later file's cell replaces an earlier one's."""
    cells, metas = {}, []
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
            metas.append(doc["meta"])
            for c in doc["cells"]:
                cells[(c["model"], c["system"], c["mode"])] = c
        except (OSError, ValueError, KeyError, TypeError) as e:
            log(f"{path}: not a gpu_bench JSON file ({e})")
            return 2
    models = list(dict.fromkeys([m for m in MODELS if any(k[0] == m for k in cells)] + [k[0] for k in cells]))
    for m in metas:
        gpu = (m.get("gpu") or {}).get("name", m.get("device"))
        print(f"{m.get('date')}: {m.get('warmup')} warmup + {m.get('steps')} timed steps, median; GPU: {gpu}; "
              f"torch {m['versions'].get('torch')}, jax {m['versions'].get('jax')}")  # fmt: skip
    print(table(list(cells.values()), models, SYSTEMS + EXTRA_SYSTEMS), flush=True)
    print(rate_table(list(cells.values())), flush=True)
    return 0


def on_sigterm(signum, frame):
    """A SIGTERM (e.g. a wall-clock limit) ends the cell in flight and still prints the table."""
    p = CURRENT["proc"]
    if p is not None:
        kill_group(p)
    raise KeyboardInterrupt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ingot", help="the ingot binary (needed for the ingot cells)")
    ap.add_argument("--models", nargs="+", default=MODELS, metavar="MODEL",
                    help="mlp, gpt-mini, gpt2, gpt2-medium, gpt-1.3b or gpt:vocab=..,... (default: mlp gpt-mini gpt2)")
    ap.add_argument("--batch", type=int, help="run every GPT at this batch (its gpt: spec with batch=N)")
    ap.add_argument("--modes", nargs="+", default=MODES, choices=MODES, help="default: f32 tf32 bf16")
    ap.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS + EXTRA_SYSTEMS,
                    help="default: the first four; also torch-compile-sdpa, ingot-plain")
    ap.add_argument("--steps", type=int, default=50, help="timed steps per cell (default 50)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per cell before it is killed (default 300)")
    ap.add_argument("--json", metavar="OUT.json", help="write all raw numbers here (rewritten after every cell)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the init and batch (default 0)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu only tests this script on a machine without a GPU (default cuda)")
    ap.add_argument("--table", nargs="+", metavar="RUN.json",
                    help="run nothing: print one table from the --json files of earlier runs")
    # One cell, in the subprocess the parent starts; not for direct use.
    ap.add_argument("--worker", choices=["torch-eager", "torch-compile", "torch-compile-sdpa", "jax"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        sys.exit(worker_main(a))
    if a.table:
        sys.exit(table_main(a.table))
    signal.signal(signal.SIGTERM, on_sigterm)
    sys.exit(parent_main(a))


if __name__ == "__main__":
    main()
