#!/usr/bin/env python3
"""PyTorch reference of Ingot's training steps, written independently of Ingot from
docs/reference-models.md, to check Ingot's losses on the same weights and batch.

    python3 scripts/torch_reference.py --model mlp --init P.safetensors --data B.safetensors \
        --steps 5 [--device cpu|cuda] [--save P2.safetensors]

prints one JSON object per step: {"step": i, "loss": ..., "seconds": ...}; the loss is the loss
of the batch before that step's update, as `ingot train --json` prints it.

Models: mlp, cnn, resnet18, gpt-mini, gpt2, gpt2-medium, gpt-1.3b,
gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=.. (the batch size and sequence
length are taken from the batch file). Everything is float32, with TF32 off (--precision bf16:
under bf16 autocast). Only torch is needed (not torchvision: resnet18 is written out here with
torchvision's module names): safetensors files are read and written here by hand (8-byte
little-endian header length, a JSON header of dtype / shape / data_offsets, raw little-endian
data).

--init holds the parameters, and may hold buffers too (batch norm's running_mean and
running_var); buffers it lacks keep PyTorch's initial values (zeros and ones, Ingot's too).
--state (an Ingot checkpoint's optimizer-STEP.safetensors) sets the state a run resumes from:
the buffers and SGD's momentum buffers ({param}.momentum_buffer). --save writes the parameters
only (what `ingot train --save` writes); --save-state writes the state after the last step by
the names Ingot's checkpoint gives it: the buffers (running_mean, running_var; not
num_batches_tracked, which momentum 0.1 never reads and Ingot does not keep) and the momentum
buffers.
"""

import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import safetensors_io  # beside this script

# --- safetensors, by hand -----------------------------------------------------------------------

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


def fail(msg):
    print(f"torch_reference: {msg}", file=sys.stderr)
    sys.exit(1)


def load_safetensors(path):
    """{name: tensor} of a safetensors file, in the order of the data."""

    def itemsize(name):
        return torch.empty((), dtype=DTYPES[name]).element_size() if name in DTYPES else None

    out = {}
    for name, dtype_name, shape, data in safetensors_io.read(path, fail, itemsize, by_offset=True):
        dtype = DTYPES[dtype_name]
        if not data:
            t = torch.empty(shape, dtype=dtype)
        else:
            # A private, aligned copy of the bytes; clone() so the tensor owns its storage.
            t = torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape).clone()
        out[name] = t
    return out


def tensor_bytes(t):
    t = t.detach().to("cpu").contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    u8 = t.view(torch.uint8)
    try:
        return u8.numpy().tobytes()
    except Exception:  # torch without numpy
        return bytes(u8.tolist())


def save_safetensors(path, tensors):
    """Writes {name: tensor} as a safetensors file (little-endian; the header padded to 8)."""
    if sys.byteorder != "little":
        fail("this script writes safetensors only on little-endian machines")
    safetensors_io.write(path, ((name, NAMES[t.dtype], t.shape, tensor_bytes(t)) for name, t in tensors.items()))


# --- the models of reference-models.md ----------------------------------------------------------


class MLP(nn.Module):
    """Linear(784→1024) → ReLU → Linear(1024→1024) → ReLU → Linear(1024→10); mean cross-entropy."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 1024)
        self.fc2 = nn.Linear(1024, 1024)
        self.fc3 = nn.Linear(1024, 10)

    def forward(self, x, y):
        h = F.relu(self.fc1(x))
        h = F.relu(self.fc2(h))
        return F.cross_entropy(self.fc3(h), y)


# "plain": attention as written below (scores and probabilities stored); "sdpa": PyTorch's fused
# attention (torch.nn.functional.scaled_dot_product_attention, is_causal=True), what a PyTorch
# user of torch.compile on an H100 runs. scripts/gpu_bench.py's torch-compile-sdpa sets it.
ATTENTION = "plain"


class Block(nn.Module):
    """Pre-LayerNorm block: x + proj(attn(ln1(x))), then x + fc2(gelu_tanh(fc(ln2(x))))."""

    def __init__(self, d, heads, d_ff):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, d_ff)
        self.fc2 = nn.Linear(d_ff, d)

    def attn(self, x):
        b, t, d = x.shape
        h = self.heads
        hd = d // h
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(b, t, h, hd).transpose(1, 2)  # [b, h, t, hd]
        k = k.view(b, t, h, hd).transpose(1, 2)
        v = v.view(b, t, h, hd).transpose(1, 2)
        if ATTENTION == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # [b, h, t, t]
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        att = F.softmax(scores, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    """Token + learned position embeddings, pre-LN blocks, final LayerNorm, head without bias."""

    def __init__(self, vocab, d_model, layers, heads, d_ff, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList([Block(d_model, heads, d_ff) for _ in range(layers)])
        self.lnf = nn.LayerNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, x, y):
        b, t = x.shape
        pos = torch.arange(t, device=x.device)
        h = self.wte(x) + self.wpe(pos)
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.lnf(h))
        return F.cross_entropy(logits.view(b * t, -1), y.reshape(b * t))


class CNN(nn.Module):
    """models/src/cnn.rs: Conv2d(1→32, 3, padding 1) → ReLU → MaxPool2d(2) →
    Conv2d(32→64, 3, padding 1) → ReLU → MaxPool2d(2) → flatten → Linear(3136→128) → ReLU →
    Linear(128→10); mean cross-entropy. Convs and linears with bias."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, stride=1, padding=1, bias=True)
        self.conv2 = nn.Conv2d(32, 64, 3, stride=1, padding=1, bias=True)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x, y):
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        h = torch.flatten(h, 1)
        h = F.relu(self.fc1(h))
        return F.cross_entropy(self.fc2(h), y)


def bn(c):
    """compiler/src/trace/conv.rs batch_norm2d: eps 1e-5, running-statistics momentum 0.1, affine,
    the running variance unbiased (PyTorch's BatchNorm2d defaults)."""
    return nn.BatchNorm2d(c, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True)


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + identity), 3×3 convs
    with padding 1 and no bias; a downsample (1×1 conv with the block's stride, no bias, then a
    batch norm) where the stride or the width changes."""

    def __init__(self, in_ch, out_ch, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = bn(out_ch)
        self.relu = nn.ReLU(inplace=False)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.bn2 = bn(out_ch)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, padding=0, bias=False), bn(out_ch)
            )

    def forward(self, x):
        h = self.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(h + identity)


class ResNet18(nn.Module):
    """models/src/resnet.rs: torchvision's resnet18(num_classes=10), by hand with its
    module names. Stem conv 7×7 stride 2 padding 3 (no bias) → bn1 → ReLU → MaxPool2d(3, 2,
    padding 1); layer1..layer4 of two BasicBlocks (64, 128, 256, 512 wide, the first block of
    layers 2–4 with stride 2); adaptive average pool to 1×1, flatten, fc Linear(512→10); mean
    cross-entropy."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = bn(64)
        self.relu = nn.ReLU(inplace=False)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        ch = 64
        for i, out in enumerate([64, 128, 256, 512]):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(ch, out, stride), BasicBlock(out, out, 1)))
            ch = out
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)

    def forward(self, x, y):
        h = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            h = layer(h)
        h = torch.flatten(self.avgpool(h), 1)
        return F.cross_entropy(self.fc(h), y)


# The optimizers, as Ingot's (compiler/src/autodiff/optim/settings.rs and autodiff/optim.rs):
# - mlp: plain SGD, lr 0.1 (p -= lr * g).
# - cnn: torch.optim.SGD lr 0.01, momentum 0.9, no weight decay.
# - resnet18: torch.optim.SGD lr 0.1, momentum 0.9, weight decay 5e-4 on every parameter
#   (batch norm gains and biases and fc.bias included).
# Ingot's momentum SGD is PyTorch's: weight decay coupled (added to the gradient,
# d = g + wd * p), dampening 0, not Nesterov: buf = momentum * buf + d (PyTorch's first step
# sets buf = d, the same from Ingot's zero buffer), p -= lr * buf.
# - gpt: AdamW lr 3e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.01 (decoupled).
def sgd(lr, momentum=0.0, weight_decay=0.0, foreach=False):
    return lambda ps: torch.optim.SGD(  # noqa: E731
        ps, lr=lr, momentum=momentum, dampening=0.0, weight_decay=weight_decay, nesterov=False,
        foreach=foreach,
    )


GPT_KEYS = ["vocab", "d_model", "layers", "heads", "d_ff", "seq", "batch"]
GPT_MINI = dict(vocab=8192, d_model=512, layers=4, heads=8, d_ff=2048, seq=256, batch=16)
GPT2 = dict(vocab=50304, d_model=768, layers=12, heads=12, d_ff=3072, seq=1024, batch=8)
# The larger GPTs Ingot names (models/src/gpt.rs): GPT-2 medium's shape and GPT-3's 1.3B.
GPT2_MEDIUM = dict(vocab=50304, d_model=1024, layers=24, heads=16, d_ff=4096, seq=1024, batch=8)
GPT_1_3B = dict(vocab=50304, d_model=2048, layers=24, heads=16, d_ff=8192, seq=1024, batch=8)
NAMED_GPTS = {"gpt-mini": GPT_MINI, "gpt2": GPT2, "gpt2-medium": GPT2_MEDIUM, "gpt-1.3b": GPT_1_3B}


def parse_gpt(body):
    cfg = {}
    for item in body.split(","):
        item = item.strip()
        if not item:
            continue
        if "=" not in item:
            fail(f"{item!r} is not key=value (keys: {', '.join(GPT_KEYS)})")
        k, v = (s.strip() for s in item.split("=", 1))
        if k not in GPT_KEYS or k in cfg:
            fail(f"unknown or repeated key {k!r} (keys: {', '.join(GPT_KEYS)})")
        cfg[k] = int(v)
    missing = [k for k in GPT_KEYS if k not in cfg]
    if missing:
        fail(f"missing keys: {', '.join(missing)}")
    return cfg


def gpt_config(spec):
    """None for the mlp, else the gpt configuration (a dict of GPT_KEYS) of a model name."""
    if spec == "mlp":
        return None
    if spec in NAMED_GPTS:
        cfg = dict(NAMED_GPTS[spec])
    elif spec.startswith("gpt:"):
        cfg = parse_gpt(spec[len("gpt:") :])
    else:
        fail(f"unknown model {spec!r}; known: mlp, cnn, resnet18, gpt-mini, gpt2, gpt2-medium, gpt-1.3b, gpt:vocab=..,d_model=..,layers=..,heads=..,d_ff=..,seq=..,batch=..")
    if cfg["d_model"] % cfg["heads"] != 0:
        fail("d_model must be divisible by heads")
    return cfg


def build(spec, foreach=False):
    """(model, optimizer factory) for a model name as `ingot` takes it.

    foreach=False (this script's own runs) keeps PyTorch's single-tensor optimizer loops, the
    plainest form of the update; scripts/gpu_bench.py passes None for PyTorch's default (the
    multi-tensor "foreach" kernels on CUDA), which is what a PyTorch user gets and times."""
    # (The CNNs are not gpt_config's: its callers that build their own batches know the mlp and
    # the GPTs only, and refuse the CNNs there.)
    if spec == "cnn":
        return CNN(), sgd(0.01, momentum=0.9, foreach=foreach)
    if spec == "resnet18":
        return ResNet18(), sgd(0.1, momentum=0.9, weight_decay=5e-4, foreach=foreach)
    cfg = gpt_config(spec)
    if cfg is None:
        return MLP(), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.0, foreach=foreach)
    model = GPT(cfg["vocab"], cfg["d_model"], cfg["layers"], cfg["heads"], cfg["d_ff"], cfg["seq"])
    adamw = lambda ps: torch.optim.AdamW(  # noqa: E731
        ps, lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=foreach, fused=False
    )
    return model, adamw


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--init", required=True, help="parameters (safetensors, PyTorch names)")
    ap.add_argument("--data", required=True, help="batch (safetensors with x and y)")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--save", help="write the parameters after the last step here")
    ap.add_argument("--state", help="start from this state (an Ingot checkpoint's optimizer "
                                    "file: running statistics, momentum buffers)")
    ap.add_argument("--save-state", help="write the state (batch norm's running statistics, "
                                         "momentum buffers) after the last step here")
    ap.add_argument("--precision", default="f32", choices=["f32", "bf16"],
                    help="bf16: the step under torch.autocast(dtype=torch.bfloat16), f32 master "
                         "weights and optimizer (what Ingot's --precision bf16 mirrors)")
    a = ap.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    if a.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda, but torch sees no CUDA device")
    device = torch.device(a.device)

    model, make_optimizer = build(a.model)
    params = load_safetensors(a.init)
    expected = model.state_dict()
    # Every parameter must be in the file; buffers (running statistics) may be. Ingot's --save
    # of a model with batch norms is a whole state_dict: its num_batches_tracked counts (which
    # momentum 0.1 never reads) are left out here.
    params = {k: v for k, v in params.items()
              if not (k.endswith("num_batches_tracked") and k in expected)}
    needed = dict(model.named_parameters())
    missing = [k for k in needed if k not in params]
    unknown = [k for k in params if k not in expected or k.endswith("num_batches_tracked")]
    if missing or unknown:
        fail(f"{a.init}: missing parameters {missing}, unknown ones {unknown}")
    for k in params:
        v = expected[k]
        if tuple(params[k].shape) != tuple(v.shape) or params[k].dtype != torch.float32:
            fail(f"{a.init}: {k} is {params[k].dtype} {list(params[k].shape)}, the model needs float32 {list(v.shape)}")
    model.load_state_dict(params, strict=False)
    model.to(device=device, dtype=torch.float32)
    model.train()

    batch = load_safetensors(a.data)
    if "x" not in batch or "y" not in batch:
        fail(f"{a.data}: a batch holds x and y; this one holds {list(batch)}")
    x, y = batch["x"], batch["y"]
    x = x.to(torch.float32) if x.dtype.is_floating_point else x.to(torch.int64)
    x, y = x.to(device), y.to(torch.int64).to(device)

    opt = make_optimizer(model.parameters())
    named = dict(model.named_parameters())
    if a.state:
        state = load_safetensors(a.state)
        buffers = dict(model.named_buffers())
        for k, v in state.items():
            if k in buffers:
                if tuple(v.shape) != tuple(buffers[k].shape):
                    fail(f"{a.state}: {k} is {list(v.shape)}, the model's {list(buffers[k].shape)}")
                buffers[k].copy_(v.to(buffers[k].dtype))
            elif k.endswith(".momentum_buffer") and k[: -len(".momentum_buffer")] in named:
                if not isinstance(opt, torch.optim.SGD) or opt.defaults["momentum"] == 0:
                    fail(f"{a.state}: {k}, but the optimizer keeps no momentum buffer")
                p = named[k[: -len(".momentum_buffer")]]
                if tuple(v.shape) != tuple(p.shape):
                    fail(f"{a.state}: {k} is {list(v.shape)}, its parameter {list(p.shape)}")
                opt.state[p]["momentum_buffer"] = v.to(device=device, dtype=p.dtype).clone()
            else:
                fail(f"{a.state}: {k!r} is neither a buffer of the model nor a momentum buffer")
    for i in range(1, a.steps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                            enabled=a.precision == "bf16"):
            loss = model(x, y)
        loss.backward()
        opt.step()
        value = loss.item()  # synchronizes
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        print(json.dumps({"step": i, "loss": value, "seconds": seconds}), flush=True)

    if a.save:
        save_safetensors(a.save, {k: v.detach().cpu() for k, v in model.named_parameters()})
    if a.save_state:
        state = {k: v.detach().cpu() for k, v in model.named_buffers()
                 if not k.endswith("num_batches_tracked")}
        for k, p in named.items():
            buf = opt.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                state[f"{k}.momentum_buffer"] = buf.detach().cpu()
        save_safetensors(a.save_state, state)


if __name__ == "__main__":
    main()
