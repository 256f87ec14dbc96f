#!/usr/bin/env bash
# Checks Ingot's training losses against PyTorch's on the same weights and batch.
#
#   scripts/compare_torch.sh path/to/ingot [--device cpu|cuda] [--steps N] [--tol T] [MODEL ...]
#
# For each model (default: two small GPT shapes and the mlp): `ingot train --steps 0` writes its
# seeded initial parameters and synthetic batch; `ingot train --steps N --init --data --json`
# and scripts/torch_reference.py then train from those files, and the N losses must agree to a
# relative difference of at most T (default 1e-4). Prints a table; exits 1 if any loss differs,
# 2 on a usage or run error. Needs python3 with torch (PyTorch runs on --device; Ingot on the CPU).
# Environment: PYTHON (default python3), KEEP=1 keeps the working directory.
set -euo pipefail

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

[[ $# -ge 1 ]] || usage
INGOT=$1; shift
[[ -x $INGOT ]] || { echo "compare_torch: $INGOT is not an executable (build it: cargo build --release -p ingot-runtime)" >&2; exit 2; }
DEVICE=cpu
STEPS=5
TOL=1e-4
MODELS=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --device) DEVICE=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --tol) TOL=$2; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "compare_torch: unknown option $1" >&2; usage ;;
        *) MODELS+=("$1"); shift ;;
    esac
done
if [[ ${#MODELS[@]} -eq 0 ]]; then
    MODELS=(
        "gpt:vocab=256,d_model=64,layers=2,heads=4,d_ff=256,seq=32,batch=4"
        "gpt:vocab=512,d_model=96,layers=3,heads=6,d_ff=384,seq=48,batch=3"
        "mlp"
    )
fi
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/compare_torch.XXXXXX")
if [[ ${KEEP:-0} != 1 ]]; then trap 'rm -rf "$WORK"' EXIT; else echo "working directory: $WORK"; fi

i=0
for model in "${MODELS[@]}"; do
    i=$((i + 1))
    dir=$WORK/$i
    mkdir -p "$dir"
    printf '%s\n' "$model" > "$dir/model"
    echo "== $model" >&2
    "$INGOT" train --model "$model" --steps 0 --seed "$i" \
        --save "$dir/init.safetensors" --save-data "$dir/batch.safetensors" --json \
        || { echo "compare_torch: ingot could not write the initial files of $model" >&2; exit 2; }
    "$INGOT" train --model "$model" --steps "$STEPS" \
        --init "$dir/init.safetensors" --data "$dir/batch.safetensors" --json > "$dir/ingot.jsonl" \
        || { echo "compare_torch: ingot train failed on $model" >&2; exit 2; }
    "$PYTHON" "$HERE/torch_reference.py" --model "$model" --steps "$STEPS" --device "$DEVICE" \
        --init "$dir/init.safetensors" --data "$dir/batch.safetensors" > "$dir/torch.jsonl" \
        || { echo "compare_torch: torch_reference.py failed on $model" >&2; exit 2; }
done

# The table and the verdict (standard library only).
"$PYTHON" - "$WORK" "$TOL" "$STEPS" "$DEVICE" <<'EOF'
import json, os, sys

work, tol, steps, device = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def losses(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(float(json.loads(line)["loss"]))
    return out

failed = 0
print(f"{'model':<64} {'step':>4} {'ingot':>14} {'torch (' + device + ')':>14} {'rel diff':>10}  ok")
for d in sorted(os.listdir(work), key=int):
    model = open(os.path.join(work, d, "model")).read().strip()
    a = losses(os.path.join(work, d, "ingot.jsonl"))
    b = losses(os.path.join(work, d, "torch.jsonl"))
    if len(a) != steps or len(b) != steps:
        print(f"{model:<64} expected {steps} losses, ingot printed {len(a)} and torch {len(b)}")
        failed += 1
        continue
    for s, (x, y) in enumerate(zip(a, b), 1):
        rel = abs(x - y) / max(abs(y), 1e-12)
        ok = rel <= tol  # NaN compares false: a NaN loss fails
        failed += not ok
        print(f"{model if s == 1 else '':<64} {s:>4} {x:>14.8f} {y:>14.8f} {rel:>10.2e}  {'yes' if ok else 'NO'}")
if failed:
    print(f"{failed} losses differ by more than {tol:g} (relative)")
    sys.exit(1)
print(f"all losses agree within {tol:g} (relative)")
EOF
