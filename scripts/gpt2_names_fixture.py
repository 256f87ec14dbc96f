#!/usr/bin/env python3
"""Makes the pretrained-names fixture of `--init` (trainer/tests/fixtures/gpt2_names/): a tiny
GPT-2 built with transformers' own GPT2LMHeadModel (random weights, no downloads), its weights
under Hugging Face's names and under nanoGPT's, one fixed batch, and transformers' loss on it.

- hf.safetensors: what `model.save_pretrained` writes (transformers' names, Conv1D weights
  stored [in, out], the head tied to `transformer.wte.weight` and so not stored);
- nanogpt.safetensors: the same weights as nanoGPT's `model.state_dict()` holds them: the same
  names, but every Conv1D weight transposed to nn.Linear's [out, in], `lm_head.weight` stored
  (tied: equal to wte), and each block's causal-mask buffer `attn.bias` [1, 1, T, T];
- batch.safetensors: `x` and `y`, int64 [4, 16] (y is not x shifted: any targets do);
- torch.json: the configuration and transformers' mean cross-entropy of the batch, in f32 (the
  model as it is) and in f64 (the model cast to double), to compare Ingot's loss with.

Every parameter is drawn at random (LayerNorm gains around 1, biases and weights normal with
std 0.3) rather than left at transformers' initialisation (std 0.02, zero biases, unit gains),
so that a bias, a gain or a transposition mapped wrongly moves the loss far from ln(64).

Run from the repository root with a Python that has torch, transformers and safetensors:
    python scripts/gpt2_names_fixture.py
"""
import json
import os
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

OUT = "trainer/tests/fixtures/gpt2_names"
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        hf = load_file(os.path.join(d, "model.safetensors"))
    save_file(hf, f"{OUT}/hf.safetensors", metadata={"format": "pt"})

    nano = {}
    for name, t in model.state_dict().items():
        t = t.detach().clone().contiguous()
        if name.endswith(CONV1D):
            t = t.t().contiguous()
        nano[name] = t
    t = cfg.n_positions
    for i in range(cfg.n_layer):
        nano[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(t, t)).view(1, 1, t, t)
    save_file(nano, f"{OUT}/nanogpt.safetensors", metadata={"format": "pt"})

    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (4, t), generator=g)
    y = torch.randint(0, cfg.vocab_size, (4, t), generator=g)
    save_file({"x": x, "y": y}, f"{OUT}/batch.safetensors")

    def loss(m):
        with torch.no_grad():
            logits = m(input_ids=x).logits
            return torch.nn.functional.cross_entropy(
                logits.reshape(-1, cfg.vocab_size), y.reshape(-1)
            ).item()

    loss32 = loss(model)
    loss64 = loss(model.double())
    with open(f"{OUT}/torch.json", "w") as f:
        json.dump(
            {
                "model": f"gpt:vocab={cfg.vocab_size},d_model={cfg.n_embd},layers={cfg.n_layer},"
                f"heads={cfg.n_head},d_ff={4 * cfg.n_embd},seq={t},batch=4",
                "hf_names": sorted(hf),
                "loss_f32": loss32,
                "loss_f64": loss64,
            },
            f,
            indent=1,
        )
        f.write("\n")
    print(f"loss f32 {loss32:.7f}, f64 {loss64:.7f}; hf names {len(hf)}, nanoGPT names {len(nano)}")


if __name__ == "__main__":
    main()
