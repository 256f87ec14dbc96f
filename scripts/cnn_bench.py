#!/usr/bin/env python3
"""Side-by-side GPU benchmark of the convolutional reference steps (`cnn`, `resnet18`):
Ingot beside PyTorch eager and torch.compile, NCHW and channels_last, in f32, tf32 and bf16.

    python3 scripts/cnn_bench.py --ingot .devbin/ingot [--models cnn resnet18]
        [--modes f32 tf32 bf16] [--steps 30] [--warmup 10] [--json OUT.json]

Every (model, system, mode) cell runs in a fresh subprocess, so each system's device memory is
measured alone. A cell runs `warmup` steps, then `steps` timed ones, and reports the median
step time (synchronised wall clock around each step, as a training loop sees it) and the peak
device memory.

PyTorch: the models as models/src/{cnn,resnet}.rs describe them (resnet18 is
torchvision's `resnet18(num_classes=10)`, built here so that torchvision is not needed), on a
synthetic batch (x normal, y uniform classes); SGD with momentum 0.9 (cnn lr 0.01; resnet18 lr
0.1, weight decay 5e-4). A step is zero_grad(set_to_none=True), forward + loss, backward,
opt.step(). torch-compile compiles the model (default mode). bf16: forward and loss under
torch.autocast(dtype=torch.bfloat16). tf32: allow_tf32 on for matmuls and cuDNN; f32: off.
Peak: torch.cuda.max_memory_allocated() over the timed steps (resident state included).
Ingot: `INGOT train --model M --device cuda --precision P --steps W+N --json`, its per-step
wall seconds and its measured_bytes.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

MODELS = ["cnn", "resnet18"]
MODES = ["f32", "tf32", "bf16"]
SYSTEMS = ["ingot", "torch-eager", "torch-compile", "torch-eager-cl", "torch-compile-cl"]


def build(model):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if model == "cnn":
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
                self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
                self.fc1 = nn.Linear(64 * 7 * 7, 128)
                self.fc2 = nn.Linear(128, 10)

            def forward(self, x):
                x = F.max_pool2d(F.relu(self.conv1(x)), 2)
                x = F.max_pool2d(F.relu(self.conv2(x)), 2)
                x = torch.flatten(x, 1)
                return self.fc2(F.relu(self.fc1(x)))

        return Net(), (128, 1, 28, 28), dict(lr=0.01, momentum=0.9)

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            out = F.relu(self.bn1(self.conv1(x)))
            return F.relu(self.bn2(self.conv2(out)) + idt)

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            layers, cin = [], 64
            for i, c in enumerate([64, 128, 256, 512]):
                s = 1 if i == 0 else 2
                layers.append(nn.Sequential(BasicBlock(cin, c, s), BasicBlock(c, c, 1)))
                cin = c
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.fc = nn.Linear(512, 10)

        def forward(self, x):
            x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
            return self.fc(x)

    return ResNet18(), (128, 3, 32, 32), dict(lr=0.1, momentum=0.9, weight_decay=5e-4)


def torch_cell(model, system, mode, warmup, steps):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    tf32 = mode != "f32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    net, shape, opt_args = build(model)
    cl = system.endswith("-cl")
    net = net.cuda()
    if cl:
        net = net.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), **opt_args)
    x = torch.randn(*shape, device="cuda")
    if cl:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (shape[0],), device="cuda")
    fwd = torch.compile(net) if system.startswith("torch-compile") else net

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16"):
            loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    losses = []
    for _ in range(warmup):
        losses.append(float(step()))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
        losses.append(float(loss))
    return {"median_ms": statistics.median(times), "step_ms": times,
            "peak_bytes": torch.cuda.max_memory_allocated(), "first_loss": losses[0], "last_loss": losses[-1],
            "torch": torch.__version__}


def ingot_cell(a, model, mode):
    cmd = [a.ingot, "train", "--model", model, "--device", "cuda", "--precision", mode,
           "--steps", str(a.warmup + a.steps), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {p.stderr[-2000:]}")
    rows, summary = [], None
    for line in p.stdout.splitlines():
        if not line.strip():
            continue
        o = json.loads(line)
        if "summary" in o:
            summary = o["summary"]
        else:
            rows.append(o)
    timed = [float(r.get("wall_seconds", r["seconds"])) * 1e3 for r in rows[a.warmup:]]
    return {"median_ms": statistics.median(timed), "step_ms": timed,
            "device_median_ms": statistics.median(float(r["seconds"]) * 1e3 for r in rows[a.warmup:]),
            "peak_bytes": summary.get("measured_bytes"), "planned_bytes": summary.get("planned_bytes"),
            "first_loss": rows[0]["loss"], "last_loss": rows[-1]["loss"], "command": " ".join(cmd)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ingot")
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    ap.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json")
    ap.add_argument("--worker", nargs=3, metavar=("MODEL", "SYSTEM", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(torch_cell(*a.worker, a.warmup, a.steps)))
        return 0
    cells = []
    for m in a.models:
        for mode in a.modes:
            for s in a.systems:
                if s.endswith("-cl") and m == "cnn":
                    continue
                cell = {"model": m, "system": s, "mode": mode}
                try:
                    if s == "ingot":
                        cell["result"] = ingot_cell(a, m, mode)
                    else:
                        p = subprocess.run([sys.executable, __file__, "--worker", m, s, mode,
                                            "--steps", str(a.steps), "--warmup", str(a.warmup)],
                                           capture_output=True, text=True, timeout=a.timeout)
                        if p.returncode != 0:
                            raise RuntimeError(p.stderr[-1500:])
                        cell["result"] = json.loads(p.stdout.strip().splitlines()[-1])
                    cell["ok"] = True
                    r = cell["result"]
                    print(f"{m:9} {mode:5} {s:17} {r['median_ms']:9.3f} ms {r['peak_bytes'] / 2**20:9.1f} MiB "
                          f"loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}", flush=True)
                except Exception as e:  # noqa: BLE001 - a failed cell is reported, not fatal
                    cell["ok"] = False
                    cell["error"] = str(e)[-1500:]
                    print(f"{m:9} {mode:5} {s:17} FAILED: {str(e)[-300:]}", flush=True)
                cells.append(cell)
                if a.json:
                    with open(a.json, "w") as f:
                        json.dump({"cells": cells, "argv": sys.argv}, f, indent=1)
    return 0 if all(c["ok"] for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
