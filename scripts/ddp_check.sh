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
# 3. With 2 or more GPUs: .devbin/test_cuda_ranks (2 GPUs on 2 shards against one GPU on the
#    union, 1e-6 over 10 steps; every GPU's allocation its plan; 1000 steps allocate nothing on
#    any), then gpt2 f32 and bf16 on 1 and on all GPUs (same per-GPU batch), Ingot's
#    `train --gpus N` beside PyTorch DDP: median step, scaling efficiency, and the time per
#    step the all-reduce is not hidden (N-GPU step minus one-GPU step). The one-GPU step runs
#    on every GPU alone (CUDA_VISIBLE_DEVICES): the efficiency is given against GPU 0 (rank
#    0's) and against the slowest GPU, whose pace an N-GPU step cannot beat. DDP_COMPILE=1
#    adds PyTorch's strongest peer in bf16: DDP over torch.compile with SDPA and a compiled
#    optimizer step, on N GPUs with and without its bf16 all-reduce hook.
# 4. One process per GPU: `torchrun --no-python ... ingot train --torchrun` over a data set
#    against `--gpus N` on it (same losses within 1e-6), its checkpoint resumed by a second
#    torchrun job continuing the uninterrupted run, and its validation losses (--val) against
#    `--gpus N`'s.
# Logs go to OUT/*.txt; the last line says PASS or FAIL. INGOT_REQUIRE_GPU=1: a missing GPU or
# NCCL fails instead of skipping.
set -uo pipefail
BIN=$1; OUT=$2
export INGOT_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
HERE=$(cd "$(dirname "$0")" && pwd)
# The checks below import summ.py (json_lines) from here.
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
status=0
fail() { echo "FAIL: $*"; status=1; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
NGPU=$(nvidia-smi -L | wc -l)

if [[ ${ONLY_TORCHRUN:-0} != 1 ]]; then
echo "== 1. NCCL one-rank test"
"$BIN/test_cuda_nccl" --test-threads=1 --nocapture > "$OUT/nccl_test.txt" 2>&1 || fail "test_cuda_nccl (see $OUT/nccl_test.txt)"
tail -n 8 "$OUT/nccl_test.txt"

echo "== 2. one rank (--gpus 1) against the single-GPU run"
for m in mlp gpt-mini; do
    "$BIN/ingot" train --model "$m" --device cuda --steps 20 --json > "$OUT/single_$m.txt" 2>&1 || fail "single-GPU $m"
    "$BIN/ingot" train --model "$m" --gpus 1 --steps 20 --json > "$OUT/gpus1_$m.txt" 2>&1 || fail "--gpus 1 $m"
    python3 - "$OUT/single_$m.txt" "$OUT/gpus1_$m.txt" "$m" <<'PY' || status=1
import json, sys
from summ import json_lines as lines
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
# As cli/tests/cuda.rs: the drop in free memory is the plan, up to the driver's 2 MiB page.
if not (planned <= measured < planned + page):
    print(f"FAIL {m}: measured is not the plan up to the 2 MiB page")
    ok = False
if s["free_change_bytes"] not in (0, None):
    print(f"FAIL {m}: free device memory changed by {s['free_change_bytes']} B over the steps")
    ok = False
sys.exit(0 if ok else 1)
PY
done

fi
if [[ $NGPU -ge 2 && ${ONLY_TORCHRUN:-0} != 1 ]]; then
    echo "== 3. $NGPU GPUs: N ranks against one GPU on the union, memory on every GPU"
    INGOT_REQUIRE_GPUS=2 timeout 600 "$BIN/test_cuda_ranks" --test-threads=1 --nocapture > "$OUT/ranks_test.txt" 2>&1 \
        || fail "test_cuda_ranks (see $OUT/ranks_test.txt)"
    grep -E "relative difference|NCCL|test result|panicked" "$OUT/ranks_test.txt"
    echo "== 3. gpt2 on 1 and $NGPU GPUs (per-GPU batch 8), Ingot and PyTorch DDP side by side"
    for p in f32 bf16; do
        timeout 300 "$BIN/ingot" train --model gpt2 --device cuda --precision "$p" --steps 30 --json \
            > "$OUT/ingot_${p}_1.txt" 2>&1 || fail "ingot gpt2 $p on 1 GPU"
        for ((g = 1; g < NGPU; g++)); do
            CUDA_VISIBLE_DEVICES=$g timeout 300 "$BIN/ingot" train --model gpt2 --device cuda --precision "$p" \
                --steps 30 --json > "$OUT/ingot_${p}_1_gpu$g.txt" 2>&1 || fail "ingot gpt2 $p on GPU $g alone"
        done
        timeout 300 "$BIN/ingot" train --model gpt2 --gpus "$NGPU" --precision "$p" --steps 30 --json \
            > "$OUT/ingot_${p}_$NGPU.txt" 2>&1 || fail "ingot gpt2 $p on $NGPU GPUs"
        for w in 1 "$NGPU"; do
            timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node="$w" "$HERE/torch_ddp.py" \
                --model gpt2 --precision "$p" --steps 30 > "$OUT/torch_ddp_${p}_$w.txt" 2>&1 || fail "torch DDP $p x$w"
            if [[ $p == bf16 && ${DDP_COMPILE:-0} == 1 ]]; then
                # The bf16 hook changes only the all-reduce, so one GPU runs without it.
                hooks=("")
                [[ $w != 1 ]] && hooks+=(--bf16-compress)
                for hook in "${hooks[@]}"; do
                    log="$OUT/torch_ddp_compile_${p}_$w${hook}.txt"
                    timeout 400 python3 -m torch.distributed.run --standalone --nproc_per_node="$w" "$HERE/torch_ddp.py" \
                        --model gpt2 --precision "$p" --steps 30 --warmup 10 --compile --attention sdpa \
                        --compile-optimizer $hook > "$log" 2>&1 || echo "torch DDP compile $p x$w $hook failed (see $log)"
                    grep '^{' "$log" | tail -n 1
                done
            fi
        done
        python3 - "$OUT" "$p" "$NGPU" <<'PY' || status=1
import json, sys
from summ import json_lines as lines
out, p, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def summary(path):
    s = [l["summary"] for l in lines(path) if "summary" in l]
    return s[0] if s else None
one, many = summary(f"{out}/ingot_{p}_1.txt"), summary(f"{out}/ingot_{p}_{n}.txt")
ok = one is not None and many is not None
if ok:
    t1, tn = one["median_wall_seconds"] * 1e3, many["median_wall_seconds"] * 1e3
    d1, dn = one["median_step_seconds"] * 1e3, many["median_step_seconds"] * 1e3
    nccl = [l["nccl"] for l in lines(f"{out}/ingot_{p}_{n}.txt") if "nccl" in l]
    alone = [one] + [summary(f"{out}/ingot_{p}_1_gpu{g}.txt") for g in range(1, n)]
    each = [s["median_step_seconds"] * 1e3 for s in alone if s is not None]
    print(f"Ingot gpt2 {p}, each GPU alone (device ms): {', '.join(f'{x:.2f}' for x in each)}; "
          f"device-time efficiency against GPU 0 {100 * d1 / dn:.1f}%, against the slowest GPU "
          f"{100 * max(each) / dn:.1f}%")
    print(f"Ingot gpt2 {p}: {t1:.2f} ms on 1 GPU, {tn:.2f} ms on {n} (wall; device {d1:.2f} / {dn:.2f}): "
          f"scaling efficiency {100 * t1 / tn:.1f}%, all-reduce not hidden {tn - t1:.2f} ms per step; "
          f"planned {many['planned_bytes']} B, measured {many['measured_bytes']} B on rank 0; "
          f"free memory change per GPU {many.get('ranks_free_change_bytes')}; NCCL {nccl[0] if nccl else None}")
    page = 2 << 20
    if not (many["planned_bytes"] <= many["measured_bytes"] < many["planned_bytes"] + page):
        print(f"FAIL {p}: measured is not the plan up to the 2 MiB page"); ok = False
    if any(d != 0 for d in (many.get("ranks_free_change_bytes") or [1])):
        print(f"FAIL {p}: free memory moved on some GPU"); ok = False
else:
    print(f"FAIL {p}: an Ingot run printed no summary")
try:
    t = [json.loads([l for l in open(f"{out}/torch_ddp_{p}_{w}.txt") if l.startswith("{")][-1]) for w in (1, n)]
    print(f"PyTorch DDP gpt2 {p}: {t[0]['median_step_ms']:.2f} ms on 1 GPU, {t[1]['median_step_ms']:.2f} ms on {n}: "
          f"scaling efficiency {100 * t[0]['median_step_ms'] / t[1]['median_step_ms']:.1f}%; peak {t[1].get('peak_mib')} MiB")
except Exception as e:
    print(f"PyTorch DDP {p}: no figure ({e})")
sys.exit(0 if ok else 1)
PY
    done
elif [[ $NGPU -lt 2 ]]; then
    echo "== 3. skipped: $NGPU GPU(s); the N-rank figures need 2 or more"
fi
if [[ $NGPU -ge 2 && ${SKIP_TORCHRUN:-0} != 1 ]]; then
    echo "== 4. one process per GPU (torchrun --no-python ... ingot train --torchrun) against --gpus $NGPU"
    python3 -c "import random; r = random.Random(1); open('$OUT/text.txt', 'w').write(''.join(r.choice('abcdefghij klmnop\n') for _ in range(400000)))"
    "$BIN/ingot" data bytes "$OUT/text.txt" "$OUT/tokens.bin" > /dev/null || fail "making tokens"
    timeout 300 "$BIN/ingot" train --model gpt-mini --gpus "$NGPU" --dataset "$OUT/tokens.bin" --steps 20 --json \
        > "$OUT/gpus_data.txt" 2>&1 || fail "--gpus $NGPU over the data set"
    rm -rf "$OUT/ck"
    timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node "$NGPU" --no-python \
        "$BIN/ingot" train --torchrun --model gpt-mini --dataset "$OUT/tokens.bin" --steps 20 --json \
        --checkpoint "$OUT/ck" > "$OUT/torchrun_data.txt" 2>&1 || fail "torchrun over the data set"
    timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node "$NGPU" --no-python \
        "$BIN/ingot" train --torchrun --model gpt-mini --dataset "$OUT/tokens.bin" --steps 25 --json \
        --resume "$OUT/ck" > "$OUT/torchrun_resumed.txt" 2>&1 || fail "torchrun resumed"
    timeout 300 "$BIN/ingot" train --model gpt-mini --gpus "$NGPU" --dataset "$OUT/tokens.bin" --steps 25 --json \
        > "$OUT/gpus_data25.txt" 2>&1 || fail "--gpus $NGPU over the data set, 25 steps"
    VAL=(--val "$OUT/tokens.bin" --eval-batches 2 --eval-every 5)
    timeout 300 "$BIN/ingot" train --model gpt-mini --gpus "$NGPU" --dataset "$OUT/tokens.bin" --steps 10 --json \
        "${VAL[@]}" > "$OUT/gpus_val.txt" 2>&1 || fail "--gpus $NGPU --val"
    timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node "$NGPU" --no-python \
        "$BIN/ingot" train --torchrun --model gpt-mini --dataset "$OUT/tokens.bin" --steps 10 --json \
        "${VAL[@]}" > "$OUT/torchrun_val.txt" 2>&1 || fail "torchrun --val"
    python3 - "$OUT" <<'PY' || status=1
import json, sys
from summ import json_lines as lines
out = sys.argv[1]
def losses(p):
    return [l["loss"] for l in lines(p) if "step" in l and "loss" in l]
a, b = losses(f"{out}/gpus_data.txt"), losses(f"{out}/torchrun_data.txt")
c, d = losses(f"{out}/torchrun_resumed.txt"), losses(f"{out}/gpus_data25.txt")
ok = len(a) == 20 and len(b) == 20
worst = max((abs(x - y) / abs(x) for x, y in zip(a, b)), default=float("nan"))
print(f"torchrun x2 against --gpus 2, 20 steps over a data set: {len(b)} losses printed (rank 0 only), "
      f"bit-identical: {a == b}, largest relative difference {worst:.2e}")
if not ok or not worst <= 1e-6:
    print("FAIL: torchrun and --gpus differ"); ok = False
print(f"resumed at step 20 to 25: {c}; the uninterrupted --gpus run's steps 21-25: {d[20:]}")
if len(c) != 5 or any(abs(x - y) > 1e-6 * abs(y) for x, y in zip(c, d[20:])):
    print("FAIL: the resumed run does not continue the uninterrupted one"); ok = False
va = [l["val_loss"] for l in lines(f"{out}/gpus_val.txt") if "val_loss" in l]
vb = [l["val_loss"] for l in lines(f"{out}/torchrun_val.txt") if "val_loss" in l]
print(f"validation losses, --gpus: {va}; torchrun: {vb}")
if len(va) != 2 or len(vb) != 2 or any(abs(x - y) > 1e-6 * abs(x) for x, y in zip(va, vb)):
    print("FAIL: torchrun's validation losses are not --gpus's"); ok = False
n = [l["nccl"] for l in lines(f"{out}/torchrun_data.txt") if "nccl" in l]
print(f"NCCL (rank 0's line): {n}")
sys.exit(0 if ok else 1)
PY
fi
[[ $status -eq 0 ]] && echo PASS || echo FAIL
exit $status
