"""Ingot's --save file back into the PyTorch module (safetensors.torch.load_model, strict, which
is load_state_dict with tied weights allowed), then the largest difference from PyTorch's own 5 steps."""
import sys, os, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors.torch import load_model
from models import build
name, out = sys.argv[1], sys.argv[2]
m = build(name, True)
missing, unexpected = load_model(m, f"{out}/ingot_saved.safetensors", strict=True)
ref = torch.load(f"{out}/torch_trained.pt")
sd = m.state_dict()
worst = max(((sd[k].float() - ref[k].float()).abs().max().item(), k) for k in ref
            if k in sd and ref[k].is_floating_point() and "running" not in k)
run = [((sd[k] - ref[k]).abs().max().item(), k) for k in ref if "running_mean" in k]
print(f"{name}: load_model(strict=True) took Ingot's --save file back; largest parameter difference from PyTorch's 5 steps {worst[0]:.3g} ({worst[1]})"
      + (f"; running_mean {max(run)[0]:.3g}" if run else ""), flush=True)
