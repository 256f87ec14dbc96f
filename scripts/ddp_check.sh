#!/usr/bin/env bash
# Data-parallel checks and figures on a GPU machine, from binaries built elsewhere:
#
#   scripts/gpu_build.sh                 # where cargo is: builds .devbin/ (ingot, test_cuda_nccl, ...)
#   scripts/ddp_check.sh .devbin OUT     # on the GPU machine
#
# 1. NCCL: found and loaded at run time, a one-rank communicator made, its device memory
#    measured, its mean over one rank the identity (.devbin/test_cuda_nccl).
# 2. One rank: `ingot train --gpus 1` gives the single-GPU run's losses bit for bit (mlp,
#    gpt-mini; 20 steps), planned = measured (the allocation's drop in free memory is the plan,
#    up to the driver's 2 MiB page), free memory unchanged over the steps, NCCL's memory on its
#    own line.
# 3. With 2 or more GPUs: Ingot's N-GPU step is NOT built (its --gpus N refusal is logged as
#    evidence); PyTorch DDP's figures are taken for later comparison: gpt2 f32 and bf16 median
#    step time on 1 and on all GPUs (same per-GPU batch), and its scaling efficiency.
# Logs go to OUT/*.txt; the last line says PASS or FAIL. INGOT_REQUIRE_GPU=1: a missing GPU or
# NCCL fails instead of skipping.
set -uo pipefail
BIN=$1; OUT=$2
export INGOT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
status=0
fail() { echo "FAIL: $*"; status=1; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
NGPU=$(nvidia-smi -L | wc -l)

echo "== 1. NCCL one-rank test"
"$BIN/test_cuda_nccl" --test-threads=1 --nocapture > "$OUT/nccl_test.txt" 2>&1 || fail "test_cuda_nccl (see $OUT/nccl_test.txt)"
tail -n 8 "$OUT/nccl_test.txt"

echo "== 2. one rank (--gpus 1) against the single-GPU run"
for m in mlp gpt-mini; do
    "$BIN/ingot" train --model "$m" --device cuda --steps 20 --json > "$OUT/single_$m.txt" 2>&1 || fail "single-GPU $m"
    "$BIN/ingot" train --model "$m" --gpus 1 --steps 20 --json > "$OUT/gpus1_$m.txt" 2>&1 || fail "--gpus 1 $m"
    python3 - "$OUT/single_$m.txt" "$OUT/gpus1_$m.txt" "$m" <<'PY' || status=1
import json, sys
def lines(p):
    out = []
    for l in open(p):
        try:
            out.append(json.loads(l))
        except ValueError:
            pass
    return out
a, b, m = lines(sys.argv[1]), lines(sys.argv[2]), sys.argv[3]
la = [l["loss"] for l in a if "step" in l and "loss" in l]
lb = [l["loss"] for l in b if "step" in l and "loss" in l]
ok = True
# serde_json prints the shortest text that reads back to the same f64: equal text = equal bits.
if len(la) != 20 or la != lb:
    print(f"FAIL {m}: losses differ: single {la[:3]}... --gpus 1 {lb[:3]}...")
    ok = False
s = [l["summary"] for l in b if "summary" in l]
n = [l["nccl"] for l in b if "nccl" in l]
if not s or not n:
    print(f"FAIL {m}: no summary or no nccl line in the --gpus 1 run")
    sys.exit(1)
s, n = s[0], n[0]
page = 2 << 20
planned, measured = s["planned_bytes"], s["measured_bytes"]
print(f"{m}: 20 losses bit-identical: {la == lb}; planned {planned} B, measured {measured} B; "
      f"CUDA context etc. {s['context_bytes']} B; NCCL {n['version']} communicator {n['device_bytes']} B; "
      f"free memory change over the run {s['free_change_bytes']} B")
# As runtime/tests/cuda.rs: the drop in free memory is the plan, up to the driver's 2 MiB page.
if not (planned <= measured < planned + page):
    print(f"FAIL {m}: measured is not the plan up to the 2 MiB page")
    ok = False
if s["free_change_bytes"] not in (0, None):
    print(f"FAIL {m}: free device memory changed by {s['free_change_bytes']} B over the steps")
    ok = False
sys.exit(0 if ok else 1)
PY
done

if [[ $NGPU -ge 2 ]]; then
    echo "== 3. $NGPU GPUs: Ingot's N-GPU step is not built; its refusal:"
    "$BIN/ingot" train --model gpt2 --gpus "$NGPU" --steps 1 > "$OUT/ingot_gpus$NGPU.txt" 2>&1
    tail -n 2 "$OUT/ingot_gpus$NGPU.txt"
    echo "== 3. PyTorch DDP figures (gpt2, per-GPU batch 8)"
    for p in f32 bf16; do
        for w in 1 "$NGPU"; do
            python3 -m torch.distributed.run --standalone --nproc_per_node="$w" "$HERE/torch_ddp.py" \
                --model gpt2 --precision "$p" --steps 30 > "$OUT/torch_ddp_${p}_$w.txt" 2>&1 || fail "torch DDP $p x$w"
            grep '^{' "$OUT/torch_ddp_${p}_$w.txt" | tail -n 1
        done
        python3 - "$OUT/torch_ddp_${p}_1.txt" "$OUT/torch_ddp_${p}_$NGPU.txt" <<'PY' || true
import json, sys
one, many = (json.loads([l for l in open(p) if l.startswith("{")][-1]) for p in sys.argv[1:3])
print(f"PyTorch DDP {one['precision']}: {one['median_step_ms']:.1f} ms on 1 GPU, {many['median_step_ms']:.1f} ms on "
      f"{many['world']}: scaling efficiency {100 * one['median_step_ms'] / many['median_step_ms']:.1f}% (same per-GPU batch)")
PY
    done
else
    echo "== 3. skipped: $NGPU GPU(s); the N-rank figures need 2 or more"
fi
[[ $status -eq 0 ]] && echo PASS || echo FAIL
exit $status
