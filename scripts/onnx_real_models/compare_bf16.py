"""One line per model: Ingot's bf16 run (`ingot train --json` on stdin) beside PyTorch's
(OUTDIR/torch_bf16.json from beside_torch.py): the first 5 losses and their largest relative
difference (the check: at most 1%), the median step, planned and measured bytes.
usage: ingot train ... --json | compare_bf16.py NAME OUTDIR"""
import json, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from summ import read_run

name, out = sys.argv[1], sys.argv[2]
t = json.load(open(f"{out}/torch_bf16.json"))
losses, summary = read_run(sys.stdin)
if summary is None or len(losses) < 5:
    sys.exit(f"{name}: no summary or fewer than 5 losses from ingot")
rel = max(abs(a - b) / abs(b) for a, b in zip(losses[:5], t["bf16_losses"]))
mib = lambda b: b / 2**20 if b is not None else float("nan")
print(f"{name} batch {t['batch']}: bf16 losses ingot {[round(v, 5) for v in losses[:5]]} torch "
      f"{[round(v, 5) for v in t['bf16_losses']]}: largest relative difference {rel:.2e} "
      f"({'within' if rel <= 0.01 else 'OVER'} 1%); step ingot {summary['median_step_seconds'] * 1e3:.2f} ms, "
      f"torch.compile {t['compile_step_ms']:.2f} ms (ratio {summary['median_step_seconds'] * 1e3 / t['compile_step_ms']:.2f}); "
      f"memory ingot planned {mib(summary.get('planned_bytes')):.1f} MiB measured {mib(summary.get('measured_bytes')):.1f} MiB, "
      f"torch peak allocated {mib(t['compile_peak_allocated']):.1f} MiB reserved {mib(t['compile_peak_reserved']):.1f} MiB",
      flush=True)
