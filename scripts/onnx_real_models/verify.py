"""Ingot's --save file back into the PyTorch module with PyTorch's strict load_state_dict (every
name of model.state_dict(), a tied pair's both names included, and no other), then the largest
difference from PyTorch's own 5 steps.
(safetensors' load_model(strict=True) refuses a file holding both names of a tied pair, which
load_state_dict wants; hence load_state_dict here.)
usage: verify.py NAME OUTDIR [SAVED_FILE_NAME]"""
import sys, os, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors.torch import load_file
from models import build
name, out = sys.argv[1], sys.argv[2]
saved = sys.argv[3] if len(sys.argv) > 3 else "ingot_saved.safetensors"
m = build(name, True)
m.load_state_dict(load_file(f"{out}/{saved}"), strict=True)
ref = torch.load(f"{out}/torch_trained.pt")
sd = m.state_dict()
worst = max(((sd[k].float() - ref[k].float()).abs().max().item(), k) for k in ref
            if k in sd and ref[k].is_floating_point() and "running" not in k)
run = [((sd[k] - ref[k]).abs().max().item(), k) for k in ref if "running_mean" in k]
print(f"{name}: load_state_dict(strict=True) took Ingot's {saved} back; largest parameter difference from PyTorch's 5 steps {worst[0]:.3g} ({worst[1]})"
      + (f"; running_mean {max(run)[0]:.3g}" if run else ""), flush=True)
