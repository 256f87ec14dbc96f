"""Session 41 (issue 46): resnet50's bf16 loss against PyTorch's on other weights and batches,
to tell a systematic gap from rounding noise. Run from the repository root on the GPU machine.

  r50_seed.py export SEED DIR   resnet50 (deterministic) with weights and a batch of 32 drawn
                                from SEED: DIR/det.onnx, state_dict.safetensors, batch.safetensors
                                (CPU only)
  r50_seed.py torch DIR         PyTorch's 5 SGD (lr 0.01) losses from those weights on that batch,
                                strict f32 and bf16 autocast (eager): DIR/torch.json
  ingot train ... --json | r50_seed.py compare DIR
                                Ingot's bf16 losses beside both, with the largest relative
                                differences (Ingot - torch bf16, Ingot - torch f32, torch bf16 -
                                torch f32) and the step at which each is largest"""
import json, os, sys
import torch, torch.nn.functional as F

sys.path[:0] = ["scripts/onnx_real_models", "scripts"]
from models import LR, build  # noqa: E402


def export_seed(seed, out):
    from safetensors.torch import save_file
    from export_onnx import export
    os.makedirs(out, exist_ok=True)
    seed_of = torch.manual_seed
    torch.manual_seed = lambda _s=0: seed_of(seed)  # build() seeds with 0: draw from SEED
    m = build("resnet50", True)
    torch.manual_seed = seed_of
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(32, 3, 224, 224, generator=g)
    y = torch.randint(0, 1000, (32,), generator=g)
    export(m, (x,), f"{out}/det.onnx", input_names=["input"])
    save_file({k: v.detach().clone().contiguous() for k, v in m.state_dict().items()},
              f"{out}/state_dict.safetensors")
    save_file({"x": x.contiguous(), "y": y.contiguous()}, f"{out}/batch.safetensors")
    print(f"seed {seed}: exported to {out}", flush=True)


def torch_losses(out):
    from safetensors.torch import load_file
    sd = load_file(f"{out}/state_dict.safetensors")
    b = load_file(f"{out}/batch.safetensors")
    x, y = b["x"].cuda(), b["y"].cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    r = {}
    for mode in ("f32", "bf16"):
        m = build("resnet50", True)
        m.load_state_dict(sd, strict=True)
        m = m.cuda().train()
        opt = torch.optim.SGD(m.parameters(), lr=LR)
        losses = []
        for _ in range(5):
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16"):
                loss = F.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        r[mode] = losses
    json.dump(r, open(f"{out}/torch.json", "w"))
    print(f"{out}: torch f32 {[round(v, 5) for v in r['f32']]} bf16 {[round(v, 5) for v in r['bf16']]}",
          flush=True)


def compare(out):
    from summ import read_run
    t = json.load(open(f"{out}/torch.json"))
    ingot, _ = read_run(sys.stdin)
    if len(ingot) < 5:
        sys.exit(f"{out}: fewer than 5 losses from ingot")

    def gap(a, b):
        d = [abs(p - q) / abs(q) for p, q in zip(a[:5], b[:5])]
        i = max(range(5), key=lambda k: d[k])
        return f"{d[i]:.2e} (step {i + 1})"

    print(f"{out}: ingot bf16 {[round(v, 5) for v in ingot[:5]]}; largest relative difference "
          f"ingot-torch_bf16 {gap(ingot, t['bf16'])}, ingot-torch_f32 {gap(ingot, t['f32'])}, "
          f"torch_bf16-torch_f32 {gap(t['bf16'], t['f32'])}", flush=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "export":
        export_seed(int(sys.argv[2]), sys.argv[3])
    elif cmd == "torch":
        torch_losses(sys.argv[2])
    else:
        compare(sys.argv[2])
