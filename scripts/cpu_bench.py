#!/usr/bin/env python3
"""CPU benchmark of the reference training steps: Ingot `--device cpu` beside PyTorch eager and
torch.compile on the same cores, f32, the same models, batches and optimizers.

    BIN=target/release/ingot python3 scripts/cpu_bench.py [--threads N]
        [--models mlp gpt-mini cnn resnet18] [--systems ingot torch-eager torch-compile]
        [--steps S] [--warmup W] [--timeout SECONDS] [--json OUT.json] [--md OUT.md]

Every (model, system) cell runs in a fresh subprocess (a crash or timeout marks only that
cell), at `--threads` threads (default: every core of the machine): Ingot's `--threads N`,
PyTorch's torch.set_num_threads(N) (and one inter-op thread). A cell runs its warm-up steps,
then its timed ones, and reports the median step time. Ingot's time is the median of the
per-step "seconds" of `BIN train --model M --device cpu --threads N --steps W+S --json` after
the warm-up (the step itself, as its summary reports it); PyTorch's is the wall clock around
zero_grad(set_to_none=True), forward + loss, backward, opt.step().

PyTorch's models are scripts/torch_reference.py's (the twins of models/src: mlp
batch 256 SGD lr 0.1; gpt-mini vocab 8192, d_model 512, 4 layers, 8 heads, d_ff 2048, seq 256,
batch 16, AdamW; cnn batch 128 and resnet18 batch 128 at 32x32, momentum SGD), on a synthetic
batch; torch-compile compiles the model's forward + loss (torch.compile, default mode), so its
first warm-up step includes the compile. Nothing is downloaded; torchvision is not needed.

Default steps (timed, after warm-up) per model, chosen so that the whole run takes a few
minutes on a 16-core host: mlp 20 (3), cnn 5 (2), resnet18 3 (2), gpt-mini 3 (2); --steps and
--warmup override them for every model. (Two warm-up steps: torch.compile compiles in the
first, and may recompile in the second.)

Output: progress on stderr; a markdown table on stdout (and in --md), with every cell's
command, steps and median in --json:

    | model | threads | Ingot ms | PyTorch eager ms | torch.compile ms | Ingot / eager | Ingot / compile |

Exit status: 0 when every cell ran, 1 when some cell failed, 2 on a usage error.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

MODELS = ["mlp", "gpt-mini", "cnn", "resnet18"]
SYSTEMS = ["ingot", "torch-eager", "torch-compile"]
DEFAULT_STEPS = {"mlp": (20, 3), "cnn": (5, 2), "resnet18": (3, 2), "gpt-mini": (3, 2)}
HERE = os.path.dirname(os.path.abspath(__file__))


def batch(torch, model):
    """A synthetic batch of the model's reference shape (as models/src builds it)."""
    g = torch.Generator().manual_seed(0)
    if model == "mlp":
        return torch.randn(256, 784, generator=g), torch.randint(0, 10, (256,), generator=g)
    if model == "cnn":
        return torch.randn(128, 1, 28, 28, generator=g), torch.randint(0, 10, (128,), generator=g)
    if model == "resnet18":
        return torch.randn(128, 3, 32, 32, generator=g), torch.randint(0, 10, (128,), generator=g)
    if model == "gpt-mini":
        x = torch.randint(0, 8192, (16, 256), generator=g)
        return x, torch.randint(0, 8192, (16, 256), generator=g)
    raise SystemExit(f"unknown model {model}")


def torch_cell(model, system, threads, warmup, steps):
    """One PyTorch cell, in this (fresh) process; returns its result as a dict."""
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(0)
    sys.path.insert(0, HERE)
    import torch_reference as ref

    net, make_opt = ref.build(model, foreach=None)
    opt = make_opt(net.parameters())
    x, y = batch(torch, model)
    fwd = torch.compile(net) if system == "torch-compile" else net

    def step():
        opt.zero_grad(set_to_none=True)
        loss = fwd(x, y)
        loss.backward()
        opt.step()
        return float(loss)

    losses, times = [], []
    t0 = time.perf_counter()
    for _ in range(warmup):
        losses.append(step())
    warm_s = time.perf_counter() - t0
    for _ in range(steps):
        t = time.perf_counter()
        losses.append(step())
        times.append((time.perf_counter() - t) * 1e3)
    return {"median_ms": statistics.median(times), "step_ms": times, "warmup_seconds": warm_s,
            "first_loss": losses[0], "last_loss": losses[-1], "torch": torch.__version__,
            "torch_threads": torch.get_num_threads()}


def ingot_cell(binary, model, threads, warmup, steps, timeout):
    cmd = [binary, "train", "--model", model, "--device", "cpu", "--threads", str(threads),
           "--steps", str(warmup + steps), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {p.stderr[-2000:]}")
    rows, summary = [], {}
    for line in p.stdout.splitlines():
        if line.strip():
            o = json.loads(line)
            if "summary" in o:
                summary = o["summary"]
            elif "loss" in o:
                rows.append(o)
    timed = [float(r["seconds"]) * 1e3 for r in rows[warmup:]]
    if not timed:
        raise RuntimeError(f"no timed steps in the output: {p.stdout[-2000:]}")
    return {"median_ms": statistics.median(timed), "step_ms": timed,
            "wall_median_ms": statistics.median(float(r.get("wall_seconds", r["seconds"])) * 1e3
                                                for r in rows[warmup:]),
            "first_loss": rows[0]["loss"], "last_loss": rows[-1]["loss"],
            "threads": summary.get("threads"), "gflops": summary.get("gflops"),
            "command": " ".join(cmd)}


def run_cell(a, model, system):
    warmup, steps = DEFAULT_STEPS[model]
    if a.steps is not None:
        steps = a.steps
    if a.warmup is not None:
        warmup = a.warmup
    t = time.perf_counter()
    cell = {"model": model, "system": system, "threads": a.threads, "warmup": warmup,
            "steps": steps}
    try:
        if system == "ingot":
            cell["result"] = ingot_cell(a.bin, model, a.threads, warmup, steps, a.timeout)
        else:
            cmd = [sys.executable, os.path.abspath(__file__), "--cell", system, "--models", model,
                   "--threads", str(a.threads), "--steps", str(steps), "--warmup", str(warmup)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            if p.returncode != 0:
                raise RuntimeError(f"exit {p.returncode}: {p.stderr[-2000:]}")
            cell["result"] = json.loads(p.stdout.strip().splitlines()[-1])
            cell["command"] = " ".join(cmd)
        cell["ok"] = True
    except subprocess.TimeoutExpired:
        cell["ok"], cell["error"] = False, f"timed out after {a.timeout} s"
    except Exception as e:  # noqa: BLE001 -- one cell's failure must not stop the others
        cell["ok"], cell["error"] = False, str(e)
    cell["wall_seconds"] = time.perf_counter() - t
    return cell


def table(cells):
    by = {(c["model"], c["system"]): c for c in cells}
    models = list(dict.fromkeys(c["model"] for c in cells))
    lines = ["| model | threads | Ingot ms | PyTorch eager ms | torch.compile ms | Ingot / eager | Ingot / compile |",
             "|---|---|---|---|---|---|---|"]

    def ms(m, s):
        c = by.get((m, s))
        if c is None:
            return None, "not run"
        if not c["ok"]:
            return None, "failed"
        return c["result"]["median_ms"], f"{c['result']['median_ms']:.1f}"

    for m in models:
        (i, it), (e, et), (k, kt) = ms(m, "ingot"), ms(m, "torch-eager"), ms(m, "torch-compile")
        ratio = lambda x: f"{i / x:.2f}x" if i is not None and x else ""  # noqa: E731
        threads = next(c["threads"] for c in cells if c["model"] == m)
        lines.append(f"| {m} | {threads} | {it} | {et} | {kt} | {ratio(e)} | {ratio(k)} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.environ.get("BIN"), help="the ingot binary (default: $BIN)")
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--cell", choices=SYSTEMS[1:], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.threads < 1:
        ap.error("--threads must be at least 1")
    if a.cell:
        print(json.dumps(torch_cell(a.models[0], a.cell, a.threads, a.warmup, a.steps)))
        return 0
    if "ingot" in a.systems and not (a.bin and os.access(a.bin, os.X_OK)):
        ap.error("set BIN (or --bin) to the ingot binary, e.g. BIN=target/release/ingot")
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "cpu": cpu_name(), "cores": os.cpu_count(),
            "threads": a.threads, "argv": sys.argv}
    cells = []
    for m in a.models:
        for s in a.systems:
            c = run_cell(a, m, s)
            cells.append(c)
            got = f"{c['result']['median_ms']:.1f} ms" if c["ok"] else c["error"][-300:]
            print(f"{m} {s} ({a.threads} threads): {got} [{c['wall_seconds']:.0f} s]",
                  file=sys.stderr, flush=True)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump({"meta": meta, "cells": cells}, f, indent=1)
    md = table(cells)
    print(md)
    if a.md:
        with open(a.md, "w") as f:
            f.write(f"{meta['date']}, {meta['cpu']}, {meta['cores']} cores, {a.threads} threads\n\n{md}\n")
    return 0 if all(c["ok"] for c in cells) else 1


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
