#!/usr/bin/env python3
"""Writes the PyTorch fixtures of the ResNet tests (compiler's names test and
cli/tests/resnet_torch.rs), using torchvision's own ResNet classes:

    OUT_DIR/torchvision_resnet_keys.json
        torchvision's resnet18() and resnet50() state_dict keys, in order, with shapes and
        dtypes (what `resnet:depth=18|50` must name its parameters and state)
    OUT_DIR/resnet50/init.safetensors    the initial state_dict of a narrow resnet50
                                         (parameters, running statistics after WARM training-
                                         mode forward passes, num_batches_tracked = WARM)
    OUT_DIR/resnet50/batch.safetensors   one batch: x [2, 3, 64, 64] f32, y [2] i64
    OUT_DIR/resnet50/torch.json          the spec, lr, the losses of 5 SGD steps (momentum
                                         0.9, weight decay 5e-4, training mode), the loss of
                                         the trained model after model.eval() on the same
                                         batch, its top-1/top-5 hits, and the trained
                                         state_dict's keys, shapes and dtypes

    python3 scripts/resnet_torch_fixtures.py cli/tests/torch [--ingot target/release/ingot]

The narrow resnet50 is torchvision's ResNet with its Bottleneck blocks and _make_layer (so
every name is torchvision's), the stem and layer widths scaled from 64 to WIDTH, as
Ingot's `resnet:depth=50,...,width=WIDTH` is, initialised with zero_init_residual=True (see
NarrowResNet for why). With --ingot, the script also trains the same
steps with Ingot, loads Ingot's --save file into the model with load_state_dict(strict=True),
and checks that model.eval()'s loss equals Ingot's evaluation loss within 1e-5.

Needs torch, torchvision and safetensors (no network, no pretrained weights). Deterministic
on the CPU: fixed seed, f32, the same batch every step.
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from safetensors.torch import load_file, save_file
from torchvision.models.resnet import Bottleneck, ResNet

STEPS = 5
WARM = 20
LR = 0.001
WIDTH = 4
SIDE = 64
BATCH = 2
CLASSES = 10
SPEC = f"resnet:depth=50,side={SIDE},batch={BATCH},classes={CLASSES},width={WIDTH}"


class NarrowResNet(ResNet):
    """torchvision's ResNet.__init__ with the widths 64, 128, 256, 512 scaled to width, 2w,
    4w, 8w (torchvision hard-codes 64); modules, names and initialisation are its own."""

    def __init__(self, block, layers, num_classes, width):
        nn.Module.__init__(self)
        self._norm_layer = nn.BatchNorm2d
        self.inplanes = width
        self.dilation = 1
        self.groups = 1
        self.base_width = 64
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, 2 * width, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 4 * width, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 8 * width, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        # torchvision's zero_init_residual=True (as its ImageNet recipes use): each block's last
        # batch norm starts at gain 0, so each block starts as the identity. Without it this
        # narrow, deep net on one random-label batch is chaotic: PyTorch f32 and f64 part by
        # 1e-2 to 1e-1 within 5 steps at lr 0.001 (the gradient reaching layer3 already differs
        # by 1e-1 between them), so no f32 implementation could match to 1e-4; with it they
        # agree to 2e-7.
        for m in self.modules():
            if isinstance(m, Bottleneck):
                nn.init.constant_(m.bn3.weight, 0)


def keys_of(model):
    return [
        {"name": k, "shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
        for k, v in model.state_dict().items()
    ]


def hits(logits, y):
    top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
    return int((top5[:, 0] == y).sum()), int((top5 == y[:, None]).any(dim=1).sum())


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    out = args[0]
    ingot = args[args.index("--ingot") + 1] if "--ingot" in args else None
    torch.manual_seed(0)
    os.makedirs(os.path.join(out, "resnet50"), exist_ok=True)
    names = {
        "torchvision": torchvision.__version__,
        "resnet18": keys_of(torchvision.models.resnet18()),
        "resnet50": keys_of(torchvision.models.resnet50()),
    }
    with open(os.path.join(out, "torchvision_resnet_keys.json"), "w") as f:
        json.dump(names, f, indent=0)
        f.write("\n")

    model = NarrowResNet(Bottleneck, [3, 4, 6, 3], CLASSES, WIDTH)
    d = os.path.join(out, "resnet50")
    x = torch.randn(BATCH, 3, SIDE, SIDE)
    y = torch.randint(0, CLASSES, (BATCH,))
    # Running statistics as a trained model has them (WARM forward passes in training mode,
    # num_batches_tracked = WARM): fresh ones (0 and 1) are far from the batch's, and the
    # evaluation of a deep narrow net would then saturate (a loss of exactly 0) and test
    # nothing; these also show that --init reads them.
    with torch.no_grad():
        model.train()
        for _ in range(WARM):
            model(x)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              os.path.join(d, "init.safetensors"))
    save_file({"x": x, "y": y}, os.path.join(d, "batch.safetensors"))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=5e-4)
    model.train()
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        logits = model(x)
        eval_loss = F.cross_entropy(logits, y).item()
    top1, top5 = hits(logits, y)
    doc = {
        "spec": SPEC,
        "lr": LR,
        "steps": STEPS,
        "warm": WARM,
        "losses": losses,
        "eval_loss": eval_loss,
        "eval_top1": top1,
        "eval_top5": top5,
        "state_dict": keys_of(model),
    }
    with open(os.path.join(d, "torch.json"), "w") as f:
        json.dump(doc, f, indent=0)
        f.write("\n")
    print(f"losses {losses}\neval loss {eval_loss} top-1 {top1}/{BATCH} top-5 {top5}/{BATCH}")
    if ingot:
        check_with_ingot(ingot, d, doc)


def check_with_ingot(ingot, d, doc):
    """Trains with Ingot as the Rust test does, loads its --save file strictly, evaluates."""
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.path.join(tmp, "trained.safetensors")
        batch = os.path.join(d, "batch.safetensors")
        cmd = [ingot, "train", "--model", doc["spec"], "--init", os.path.join(d, "init.safetensors"),
               "--data", batch, "--val", batch, "--eval-batches", "1", "--steps", str(STEPS),
               "--lr", str(LR), "--save", saved, "--json"]
        run = subprocess.run(cmd, capture_output=True, text=True, check=True)
        lines = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
        ingot_losses = [l["loss"] for l in lines if "step" in l and "loss" in l]
        ingot_eval = [l for l in lines if "val_loss" in l][-1]
        model = NarrowResNet(Bottleneck, [3, 4, 6, 3], CLASSES, WIDTH)
        model.load_state_dict(load_file(saved), strict=True)
        model.eval()
        b = load_file(batch)
        with torch.no_grad():
            torch_eval = F.cross_entropy(model(b["x"]), b["y"]).item()
        for i, (a, t) in enumerate(zip(ingot_losses, doc["losses"])):
            print(f"step {i + 1}: ingot {a:.9f} torch {t:.9f} rel {abs(a - t) / abs(t):.2e}")
        rel = abs(ingot_eval["val_loss"] - torch_eval) / abs(torch_eval)
        print(f"eval: ingot {ingot_eval['val_loss']:.9f}, torch on ingot's saved file "
              f"(load_state_dict strict) {torch_eval:.9f}, rel {rel:.2e}; "
              f"ingot top-1 {ingot_eval.get('val_top1')} top-5 {ingot_eval.get('val_top5')}")
        assert rel <= 1e-5, "eval loss differs"


if __name__ == "__main__":
    main()
