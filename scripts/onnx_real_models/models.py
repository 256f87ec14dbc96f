"""Session 24 (issue 46), run on the GPU machine (torch, torchvision, transformers, safetensors): each listed model exported twice with scripts/export_onnx.py -- as is
(training mode: dropout, stochastic depth) and with every dropout/stochastic-depth p set to 0
(deterministic, for the loss comparison) -- plus its full state_dict (safetensors.torch.save_model),
one batch, and PyTorch's 5 strict-f32 SGD losses on that batch from those weights.
The state_dict is written whole (state_dict.safetensors: every name of model.state_dict(), a
tied pair such as GPT-2's lm_head.weight / transformer.wte.weight under both names, cloned);
safetensors' save_model file (one name of a tied pair, the other in its metadata) is written
too, as state_dict_save_model.safetensors.
usage: models.py NAME OUTDIR"""
import json, os, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
from safetensors.torch import save_file, save_model
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from export_onnx import export

# The batch (BATCH=N to time a larger one, session 26); DET_ONLY=1 skips the as-is export.
B = int(os.environ.get("BATCH", "8"))
LR = 0.01
# The transformers models: small configs (2 layers, width 128, sequence 32) and real sizes
# (GPT-2 small at sequence 1024, BERT-base at 512): vocabulary and sequence of each.
TEXT = {"gpt2": (1000, 32), "bert": (1000, 32), "gpt2_124m": (50257, 1024), "gpt2_large": (50257, 1024), "bert_base": (30522, 512)}


class Wrap(nn.Module):
    """A transformers model returning its logits."""
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        kw = {}
        if attention_mask is not None:
            kw = dict(attention_mask=attention_mask, token_type_ids=token_type_ids)
        return self.m(input_ids=input_ids, **kw).logits


class UNet(nn.Module):
    def __init__(self, c=16, classes=3):
        super().__init__()
        blk = lambda i, o: nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())
        self.d1, self.d2, self.mid = blk(3, c), blk(c, 2 * c), blk(2 * c, 4 * c)
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.u2 = blk(4 * c, 2 * c)
        self.u1 = blk(2 * c + c, c)
        self.head = nn.Conv2d(c, classes, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(F.max_pool2d(a, 2))
        # (nearest upsampling in the middle: the bottleneck at 1/8, brought back to 1/4)
        m = self.mid(F.interpolate(F.max_pool2d(b, 4), scale_factor=2, mode="nearest"))
        u = self.u2(torch.cat([self.up2(m), b], 1))
        u = F.interpolate(u, scale_factor=2, mode="bilinear", align_corners=False)
        u = self.u1(torch.cat([u, a], 1))
        return self.head(u)


def build(name, det):
    import torchvision
    torch.manual_seed(0)
    if name in TEXT:
        import transformers as tf
        p = 0.0 if det else 0.1
        if name == "bert_base":
            # BERT-base's shape (bert-base-uncased's config), random weights.
            cfg = tf.BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                intermediate_size=3072, max_position_embeddings=512,
                                hidden_dropout_prob=p, attention_probs_dropout_prob=p)
            return Wrap(tf.BertForMaskedLM(cfg))
        if name == "gpt2_124m":
            # GPT-2 small's shape (the `gpt2` checkpoint's config), random weights.
            cfg = tf.GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                                resid_pdrop=p, embd_pdrop=p, attn_pdrop=p)
            return Wrap(tf.GPT2LMHeadModel(cfg))
        if name == "gpt2_large":
            # GPT-2 large's shape (774 M parameters, 3.1 GB in f32: past protobuf's 2 GiB, so
            # exported with external data), random weights.
            cfg = tf.GPT2Config(vocab_size=50257, n_positions=1024, n_embd=1280, n_layer=36, n_head=20,
                                resid_pdrop=p, embd_pdrop=p, attn_pdrop=p)
            return Wrap(tf.GPT2LMHeadModel(cfg))
        if name == "bert":
            cfg = tf.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=256, max_position_embeddings=64,
                                hidden_dropout_prob=p, attention_probs_dropout_prob=p)
            return Wrap(tf.BertForMaskedLM(cfg))
        cfg = tf.GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                            resid_pdrop=p, embd_pdrop=p, attn_pdrop=p)
        return Wrap(tf.GPT2LMHeadModel(cfg))
    if name == "unet":
        return UNet()
    m = getattr(torchvision.models, name)(num_classes=1000)
    if det:
        for mod in m.modules():
            if isinstance(mod, nn.Dropout):
                mod.p = 0.0
            if type(mod).__name__ == "StochasticDepth":
                mod.p = 0.0
    return m


def main(name, out):
  os.makedirs(out, exist_ok=True)
  if name in TEXT:
      vocab, seq = TEXT[name]
      x = torch.randint(0, vocab, (B, seq))
      y = torch.randint(0, vocab, (B, seq))
      bert = name.startswith("bert")
      args = (x, torch.ones(B, seq, dtype=torch.long), torch.zeros(B, seq, dtype=torch.long)) if bert else (x,)
      in_names = ["input_ids", "attention_mask", "token_type_ids"] if bert else ["input_ids"]
      loss_fn = lambda z, y: F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1))
  elif name == "unet":
      x = torch.randn(B, 3, 64, 64)
      y = torch.randn(B, 3, 64, 64)
      args, in_names = (x,), ["input"]
      loss_fn = F.mse_loss
  else:
      x = torch.randn(B, 3, 224, 224)
      y = torch.randint(0, 1000, (B,))
      args, in_names = (x,), ["input"]
      loss_fn = F.cross_entropy

  t = time.time()
  only_det = name in ("vit_b_16", "unet", "gpt2_124m", "gpt2_large", "bert_base") or os.environ.get("DET_ONLY") == "1"
  for det in ((True,) if only_det else (False, True)):
      m = build(name, det)
      export(m, args, f"{out}/{'det' if det else 'train'}.onnx", input_names=in_names)
  print(f"{name}: exported both in {time.time() - t:.1f} s", flush=True)
  m = build(name, True)
  save_file({k: v.detach().clone().contiguous() for k, v in m.state_dict().items()},
            f"{out}/state_dict.safetensors")
  save_model(m, f"{out}/state_dict_save_model.safetensors")
  save_file({"x": x.contiguous(), "y": y.contiguous()}, f"{out}/batch.safetensors")
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  mc = m.cuda().train()
  opt = torch.optim.SGD(mc.parameters(), lr=LR)
  ca = [a.cuda() for a in args]
  yc = y.cuda()
  losses = []
  for _ in range(5):
      opt.zero_grad(set_to_none=True)
      l = loss_fn(mc(*ca), yc)
      l.backward()
      opt.step()
      losses.append(l.item())
  torch.save({k: v.detach().cpu() for k, v in mc.state_dict().items()}, f"{out}/torch_trained.pt")
  json.dump({"losses": losses}, open(f"{out}/torch_losses.json", "w"))
  print(f"{name}: torch strict f32 SGD lr {LR} losses {losses}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
