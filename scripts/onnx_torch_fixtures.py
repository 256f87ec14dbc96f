#!/usr/bin/env python3
"""Writes the PyTorch fixtures of the ONNX importer's training test (onnx/tests/torch.rs):
for a few small models (an MLP, a torchvision-like CNN with batch norm and a residual block,
a GPT-like transformer, where transformers is installed its GPT-2 and BERT at a tiny
config, a convolutional model padding with F.pad in every mode ONNX's Pad has but wrap, and
the MLP, the padding model, the GPT and transformers' two exported with `dynamo=True`), a folder OUT_DIR/<name>/ holding

    model.onnx           the training-mode export (scripts/export_onnx.py)
    init.safetensors     the initial state_dict (parameters and buffers)
    batch.safetensors    one batch: x, and the labels y
    losses.json          the losses of 5 SGD steps in PyTorch (f32, CPU), lr, the logits output,
                         and for a transformer how many attentions Ingot must fuse

    python3 scripts/onnx_torch_fixtures.py onnx/tests/torch [NAME ...]   # only NAMEs if given

The `dynamo_*` fixtures are exported with `dynamo=True` (needs onnxscript) at the newest opset
the installed onnx writes (`onnx.defs.onnx_opset_version()`).

Needs torch, onnx and safetensors (no network, no pretrained weights). Deterministic on the
CPU: fixed seeds, f32, the same batch every step (as `Session::set_batch` trains).
"""
import json
import os
import sys

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_onnx import export  # noqa: E402

STEPS = 5
LR = 0.1


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class Block(nn.Module):
    """torchvision's BasicBlock, without downsampling."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.layer1 = Block(8)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer1(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Attention(nn.Module):
    def __init__(self, d, heads, seq):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).bool(), persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        h = self.heads
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (d // h) ** 0.5)
        att = att.masked_fill(~self.mask[:t, :t], torch.finfo(att.dtype).min)
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class GPT(nn.Module):
    def __init__(self, vocab=32, d=16, heads=2, seq=8, layers=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            blk = nn.Module()
            blk.ln1 = nn.LayerNorm(d)
            blk.attn = Attention(d, heads, seq)
            blk.ln2 = nn.LayerNorm(d)
            blk.fc = nn.Linear(d, 4 * d)
            blk.fc2 = nn.Linear(4 * d, d)
            self.blocks.append(blk)
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = x + blk.attn(blk.ln1(x))
            x = x + blk.fc2(F.gelu(blk.fc(blk.ln2(x)), approximate="tanh"))
        return self.head(self.lnf(x))


class PadNet(nn.Module):
    """F.pad in every mode ONNX's Pad imports: constant (a value other than 0, uneven), reflect,
    replicate (ONNX's edge), a crop (negative pads) and a reflect pad beside a crop."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3)
        self.conv2 = nn.Conv2d(4, 6, 3)
        self.fc = nn.Linear(6, 10)

    def forward(self, x):
        x = F.pad(x, (1, 2, 0, 1), mode="constant", value=0.5)
        x = F.relu(self.conv1(x))
        x = F.pad(x, (2, 1, 1, 2), mode="reflect")
        x = self.conv2(x)
        x = F.pad(x, (1, 0, 2, 1), mode="replicate")
        x = F.pad(x, (-1, 0, 0, -2))
        x = F.pad(torch.tanh(x), (3, -1, 0, 0), mode="reflect")
        return self.fc(x.mean((2, 3)))


class Logits(nn.Module):
    """A transformers model called on token ids alone, returning its logits; BERT's attention
    mask (all ones) and token types (all zeros) are made inside, so they export as constants."""

    def __init__(self, m, bert):
        super().__init__()
        self.m = m
        self.bert = bert

    def forward(self, idx):
        if self.bert:
            return self.m(input_ids=idx, attention_mask=torch.ones_like(idx),
                          token_type_ids=torch.zeros_like(idx)).logits
        return self.m(input_ids=idx).logits


def transformers_models():
    """transformers' GPT-2 and BERT at a tiny config (random weights, no dropout): their
    exported attention (PyTorch's SDPA export: q and k each scaled, an additive mask, a NaN
    guard) must become Ingot's fused attention, one per layer (`attentions`)."""
    try:
        import transformers as tf
    except ImportError:
        print("transformers is not installed: the hf_gpt2 and hf_bert fixtures are not written")
        return
    gpt = tf.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    yield "hf_gpt2", Logits(tf.GPT2LMHeadModel(gpt), False), 2
    bert = tf.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=8,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    yield "hf_bert", Logits(tf.BertForMaskedLM(bert), True), 2


def transformers_version():
    import transformers
    return transformers.__version__


def cases():
    g = torch.Generator().manual_seed(0)
    yield "mlp", MLP(), torch.randn(8, 20, generator=g), torch.randint(0, 10, (8,), generator=g), None
    yield "cnn", CNN(), torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g), None
    yield "gpt", GPT(), torch.randint(0, 32, (2, 8), generator=g), torch.randint(0, 32, (2, 8), generator=g), 2
    for name, module, attentions in transformers_models():
        yield name, module, torch.randint(0, 32, (2, 8), generator=g), torch.randint(0, 32, (2, 8), generator=g), attentions
    # Seeded apart from the cases above (whose count depends on transformers being installed).
    torch.manual_seed(46)
    g = torch.Generator().manual_seed(46)
    yield "pad", PadNet(), torch.randn(2, 3, 7, 6, generator=g), torch.randint(0, 10, (2,), generator=g), None
    # PyTorch's dynamo exporter (torch.export, onnxscript), at the newest opset the installed
    # onnx writes, where its version converter can convert (it cannot convert Gelu: the GPT
    # stays at the exporter's 18). No batch norm: the dynamo export writes its inference form.
    torch.manual_seed(47)
    g = torch.Generator().manual_seed(47)
    yield "dynamo_mlp", MLP(), torch.randn(8, 20, generator=g), torch.randint(0, 10, (8,), generator=g), None
    yield "dynamo_pad", PadNet(), torch.randn(2, 3, 7, 6, generator=g), torch.randint(0, 10, (2,), generator=g), None
    yield "dynamo_gpt", GPT(), torch.randint(0, 32, (2, 8), generator=g), torch.randint(0, 32, (2, 8), generator=g), 2
    # transformers' GPT-2 and BERT under dynamo: ONNX's Attention op (opset 23) for their SDPA,
    # and BERT's token types a GatherND of constants.
    torch.manual_seed(48)
    g = torch.Generator().manual_seed(48)
    for name, module, attentions in transformers_models():
        yield "dynamo_" + name, module, torch.randint(0, 32, (2, 8), generator=g), torch.randint(0, 32, (2, 8), generator=g), attentions


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "onnx/tests/torch"
    only = set(sys.argv[2:])  # names to write (default: all)
    torch.manual_seed(0)
    for name, module, x, y, attentions in cases():
        if only and name not in only:
            continue
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        module = module.float().train()
        # Parameters and buffers before anything runs (export traces one forward pass and
        # restores them).
        init = {k: v.detach().clone().contiguous() for k, v in module.state_dict().items()}
        save_file(init, os.path.join(d, "init.safetensors"))
        dynamo = name.startswith("dynamo_")
        export(module, (x,), os.path.join(d, "model.onnx"), input_names=["input"], output_names=["logits"],
               dynamo=dynamo, **({"opset": onnx.defs.onnx_opset_version()} if dynamo else {}))
        module.load_state_dict(init)
        save_file({"x": x.contiguous(), "y": y.contiguous()}, os.path.join(d, "batch.safetensors"))
        opt = torch.optim.SGD(module.parameters(), lr=LR)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            logits = module(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        with open(os.path.join(d, "losses.json"), "w") as f:
            json.dump({"losses": losses, "lr": LR, "optimizer": "sgd", "loss": "cross-entropy",
                       "logits": "logits", "torch": torch.__version__,
                       **({"attentions": attentions} if attentions else {}),
                       **({"exporter": "dynamo", "opset": onnx.load(os.path.join(d, "model.onnx")).opset_import[0].version,
                           "onnx": onnx.__version__, "onnxscript": __import__("onnxscript").__version__}
                          if dynamo else {}),
                       **({"transformers": transformers_version()} if "hf_" in name else {})},
                      f, indent=1)
        print(f"{d}: losses {', '.join(f'{v:.6f}' for v in losses)}")


if __name__ == "__main__":
    main()
