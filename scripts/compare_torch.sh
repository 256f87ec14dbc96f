#!/usr/bin/env bash
# Checks Ingot's training losses and updated parameters against PyTorch's on the same weights
# and batch.
#
#   scripts/compare_torch.sh path/to/ingot [--device cpu|cuda] [--ingot-device cpu|cuda]
#                            [--steps N] [--tol T] [--param-tol P] [--precision f32|bf16]
#                            [--momentum-tol M] [--free-running] [MODEL ...]
#
# For each model (default: two small GPT shapes and the mlp; also cnn and resnet18): `ingot
# train --steps 0` writes its seeded initial parameters and synthetic batch; `ingot train --steps
# N --init --data --json --save` (on --ingot-device, default cpu) and scripts/torch_reference.py
# (on --device, default cpu; f32, TF32 off) then train from those files. The N losses must agree
# to a relative difference of at most T (default 1e-4), and every parameter tensor after the last
# step to max|ingot - torch| / max(max|torch|, 1e-6) <= P (default 5e-2); the worst tensor is
# printed.
# resnet18 is compared anchored: step k of PyTorch starts from Ingot's checkpoint after step
# k - 1 (parameters, momentum buffers, batch norm's running statistics; Ingot runs each step as
# a --resume of the last, which on the CPU repeats the uninterrupted run bit for bit), and its
# loss, parameters and state (running_mean, running_var, momentum buffers: the "state" line)
# after that step are checked against Ingot's, each step alone: the running statistics within
# P, the momentum buffers within M (default 0.25). M is looser because a buffer holds the step's
# gradient itself, and on one batch of random labels the gradient is a small sum of large
# per-sample terms: where a pre-activation is within rounding of 0, one ReLU more or less moves
# a tensor's gradient by up to ~1e-1 of its scale (seen at layer3.1.conv1: one element of
# -5e-8 in f64, positive in Ingot's f32; flipping that one ReLU in PyTorch f64 gives Ingot's
# buffers to 1e-6). The parameters, moved by lr times that, stay within P. Free running (--free-running),
# resnet18's trajectory at lr 0.1 on one random-label batch is chaotic: a ReLU or two whose
# pre-activation is within rounding of 0 flip, each moving some gradients by ~1e-2 of their
# scale, and momentum and lr 0.1 grow that to 1e-3 of the loss by step 3 and 1e-1 by step 5
# (PyTorch f32 against PyTorch f64 differs as much; so does PyTorch f64 from weights perturbed
# by 1e-7). With --free-running, resnet18 state after the last step is checked too.
# In bf16, resnet18's anchored step is also run by PyTorch in f32 from the same state, the
# yardstick: a loss passes within T of PyTorch bf16's, or within max(T, 2 x PyTorch bf16's
# distance) of the f32 one; a tensor within max(P, or M for a momentum buffer, 2 x PyTorch
# bf16's distance) of the f32 one.
# (On one random-label batch the gradient is a small sum of large per-sample terms: bf16
# rounding moves it by ~30% (median over tensors) in PyTorch and Ingot alike, up to ~50% in
# batch norm biases; and at a small loss two bf16 losses may be on either side of the f32 one.)
# --precision bf16 trains Ingot with --precision bf16 and PyTorch under bf16 autocast (default
# T then 1e-2 and P 2e-1: the two round in different places, and AdamW turns gradient rounding
# into update noise of up to lr per element; a wrong update is still O(1)).
# Prints a table; exits 1 if any loss or parameter differs, 2 on a usage or run error.
# Needs python3 with torch. Environment: PYTHON (default python3), KEEP=1 keeps the working
# directory.
#
# Why P is looser than T: two correct f32 implementations (PyTorch and scripts/jax_reference.py,
# or Ingot, on the CPU, 5 to 10 steps) differ by up to 1.3e-2 in some tensors. In the mlp a
# pre-activation within rounding of 0 falls on the other side of a ReLU in one of them: one
# sample's gradient more or less, a jump of ~3e-3 to 1.3e-2 of a bias tensor (biases start at 0,
# so their scale is small). In the gpt the key part of qkv.bias has an exactly zero gradient, so
# AdamW's m/sqrt(v) turns rounding noise into updates of up to lr (~2e-3 of that tensor's scale).
# A wrong update shows as O(1); the losses keep T.
set -euo pipefail

usage() { sed -n '2,44p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

[[ $# -ge 1 && $1 != -h && $1 != --help ]] || usage
INGOT=$1; shift
[[ -x $INGOT ]] || { echo "compare_torch: $INGOT is not an executable (build it: cargo build --release -p ingot)" >&2; exit 2; }
DEVICE=cpu
INGOT_DEVICE=cpu
STEPS=5
TOL=
PARAM_TOL=
MOMENTUM_TOL=
PRECISION=f32
FREE=0
MODELS=()
need() { [[ $# -ge 2 && -n $2 ]] || { echo "compare_torch: $1 needs a value" >&2; usage; }; }
while [[ $# -gt 0 ]]; do
    case $1 in
        --device) need "$@"; DEVICE=$2; shift 2 ;;
        --ingot-device) need "$@"; INGOT_DEVICE=$2; shift 2 ;;
        --steps) need "$@"; STEPS=$2; shift 2 ;;
        --tol) need "$@"; TOL=$2; shift 2 ;;
        --param-tol) need "$@"; PARAM_TOL=$2; shift 2 ;;
        --momentum-tol) need "$@"; MOMENTUM_TOL=$2; shift 2 ;;
        --precision) need "$@"; PRECISION=$2; shift 2 ;;
        --free-running) FREE=1; shift ;;
        -h|--help) usage ;;
        -*) echo "compare_torch: unknown option $1" >&2; usage ;;
        *) MODELS+=("$1"); shift ;;
    esac
done
case $DEVICE in cpu|cuda) ;; *) echo "compare_torch: --device is cpu or cuda, not $DEVICE" >&2; exit 2 ;; esac
case $INGOT_DEVICE in cpu|cuda) ;; *) echo "compare_torch: --ingot-device is cpu or cuda, not $INGOT_DEVICE" >&2; exit 2 ;; esac
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || { echo "compare_torch: --steps must be a positive integer, not $STEPS" >&2; exit 2; }
case $PRECISION in
    f32) TOL=${TOL:-1e-4}; PARAM_TOL=${PARAM_TOL:-5e-2}; MOMENTUM_TOL=${MOMENTUM_TOL:-2.5e-1} ;;
    bf16) TOL=${TOL:-1e-2}; PARAM_TOL=${PARAM_TOL:-2e-1}; MOMENTUM_TOL=${MOMENTUM_TOL:-2.5e-1} ;;
    *) echo "compare_torch: --precision is f32 or bf16, not $PRECISION" >&2; exit 2 ;;
esac
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
    : > "$dir/pairs"
    echo "== $model" >&2
    "$INGOT" train --model "$model" --steps 0 --seed "$i" \
        --save "$dir/init.safetensors" --save-data "$dir/batch.safetensors" --json > "$dir/init.jsonl" \
        || { echo "compare_torch: ingot could not write the initial files of $model" >&2; exit 2; }
    ingot_failed() { echo "compare_torch: ingot train --device $INGOT_DEVICE failed on $model" >&2; exit 2; }
    torch_failed() { echo "compare_torch: torch_reference.py --device $DEVICE failed on $model" >&2; exit 2; }
    if [[ $model == resnet18 && $FREE != 1 ]]; then
        # Anchored: step k of PyTorch starts from Ingot's state after step k - 1 (its checkpoint:
        # parameters, momentum buffers, running statistics), so each step is checked alone.
        : > "$dir/ingot.jsonl"
        : > "$dir/torch.jsonl"
        for ((k = 1; k <= STEPS; k++)); do
            if ((k == 1)); then
                from=(--init "$dir/init.safetensors")
                torch_from=(--init "$dir/init.safetensors")
            else
                from=(--resume "$dir/ckpt")
                torch_from=(--init "$dir/ingot.$((k - 1)).safetensors" --state "$dir/ingot_state.$((k - 1)).safetensors")
            fi
            "$INGOT" train --model "$model" --steps "$k" --device "$INGOT_DEVICE" --precision "$PRECISION" \
                "${from[@]}" --data "$dir/batch.safetensors" --json --checkpoint "$dir/ckpt" >> "$dir/ingot.jsonl" \
                || ingot_failed
            cp "$dir/ckpt/$(printf 'weights-%08d.safetensors' "$k")" "$dir/ingot.$k.safetensors"
            cp "$dir/ckpt/$(printf 'optimizer-%08d.safetensors' "$k")" "$dir/ingot_state.$k.safetensors"
            "$PYTHON" "$HERE/torch_reference.py" --model "$model" --steps 1 --device "$DEVICE" \
                --precision "$PRECISION" "${torch_from[@]}" --data "$dir/batch.safetensors" \
                --save "$dir/torch.$k.safetensors" --save-state "$dir/torch_state.$k.safetensors" \
                >> "$dir/torch.jsonl" || torch_failed
            yard=
            if [[ $PRECISION == bf16 ]]; then
                # The yardstick: PyTorch's f32 step from the same state.
                "$PYTHON" "$HERE/torch_reference.py" --model "$model" --steps 1 --device "$DEVICE" \
                    --precision f32 "${torch_from[@]}" --data "$dir/batch.safetensors" \
                    --save "$dir/torch32.$k.safetensors" --save-state "$dir/torch32_state.$k.safetensors" \
                    >> "$dir/torch32.jsonl" || torch_failed
                yard=1
            fi
            printf 'params %d ingot.%d.safetensors torch.%d.safetensors%s\n' "$k" "$k" "$k" \
                "${yard:+ torch32.$k.safetensors}" >> "$dir/pairs"
            printf 'state %d ingot_state.%d.safetensors torch_state.%d.safetensors%s\n' "$k" "$k" "$k" \
                "${yard:+ torch32_state.$k.safetensors}" >> "$dir/pairs"
        done
        echo anchored > "$dir/mode"
        continue
    fi
    # Both runs start from the same files and save their parameters after the last step; for
    # resnet18 (batch norm), also their state (Ingot's in a checkpoint, PyTorch's through
    # --save-state): running statistics and momentum buffers.
    state=()
    torch_state=()
    if [[ $model == resnet18 ]]; then
        state=(--checkpoint "$dir/ckpt")
        torch_state=(--save-state "$dir/torch_state.safetensors")
        printf 'state 0 ckpt/%s torch_state.safetensors\n' "$(printf 'optimizer-%08d.safetensors' "$STEPS")" >> "$dir/pairs"
    fi
    printf 'params 0 ingot.safetensors torch.safetensors\n' >> "$dir/pairs"
    "$INGOT" train --model "$model" --steps "$STEPS" --device "$INGOT_DEVICE" --precision "$PRECISION" \
        --init "$dir/init.safetensors" --data "$dir/batch.safetensors" --json \
        --save "$dir/ingot.safetensors" ${state[@]+"${state[@]}"} > "$dir/ingot.jsonl" \
        || ingot_failed
    "$PYTHON" "$HERE/torch_reference.py" --model "$model" --steps "$STEPS" --device "$DEVICE" \
        --precision "$PRECISION" --init "$dir/init.safetensors" --data "$dir/batch.safetensors" \
        --save "$dir/torch.safetensors" ${torch_state[@]+"${torch_state[@]}"} > "$dir/torch.jsonl" \
        || torch_failed
done

# The table and the verdict (torch, and torch_reference.py's safetensors reader).
"$PYTHON" - "$WORK" "$TOL" "$STEPS" "$DEVICE" "$INGOT_DEVICE" "$PARAM_TOL" "$HERE" "$MOMENTUM_TOL" <<'EOF'
import json, os, sys

work, tol, steps, device, ingot_device, param_tol, here, momentum_tol = sys.argv[1:9]
tol, steps, param_tol, momentum_tol = float(tol), int(steps), float(param_tol), float(momentum_tol)
sys.path.insert(0, here)
sys.dont_write_bytecode = True  # no scripts/__pycache__ left in the checkout
from torch_reference import load_safetensors as load_all


def load_safetensors(path, names=None):
    """The tensors of a file, only those whose names pass `names` if given."""
    t = load_all(path)
    return t if names is None else {k: v for k, v in t.items() if names(k)}

def losses(path):
    """The "loss" of each step line; other lines (ingot's closing {"summary": ...}) are skipped."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                obj = json.loads(line)
                if "loss" in obj:
                    out.append(float(obj["loss"]))
    return out

def rel_diff(x, y):
    """max|x - y| / max(max|y|, 1e-6) (inf for NaN or a shape mismatch), and its detail."""
    x, y = x.double(), y.double()
    if x.shape != y.shape:
        return float("inf"), f"shape {list(x.shape)} vs {list(y.shape)}"
    scale = max(y.abs().max().item() if y.numel() else 0.0, 1e-6)
    diff = (x - y).abs().max().item() if y.numel() else 0.0
    if diff != diff:  # NaN anywhere in either: fails
        diff = float("inf")
    return diff / scale, f"max|diff| {diff:.3e}, max|torch| {scale:.3e}"


def compare(pairs, what, param_tol, names=None):
    """(failures, line): every tensor of each ingot file against its torch file, and the worst
    one. rel = max|a - b| / max(max|b|, 1e-6), per tensor. pairs: (step, ingot, torch, f32),
    step 0 for the one pair of a free run; f32 (bf16 anchored runs) is PyTorch's f32 step from
    the same state, None elsewhere: then ingot's bf16 tensor passes within P of it or within
    twice PyTorch's bf16 distance from it."""
    if any(p[3] for p in pairs):
        return compare_bf16(pairs, what, param_tol, names)
    failed, worst, total = 0, None, 0
    for step, a_path, b_path, _ in pairs:
        a, b = load_safetensors(a_path, names), load_safetensors(b_path, names)
        at = f" after step {step}" if step else ""
        if not b:
            return failed + 1, f"{'':<64} {what}: torch saved none{at}  NO"
        if set(a) != set(b):
            return failed + 1, (f"{'':<64} {what}{at}: ingot saved {sorted(set(a) - set(b))} that torch "
                                f"did not, and not {sorted(set(b) - set(a))}  NO")
        for name in sorted(b):
            total += 1
            rel, detail = rel_diff(a[name], b[name])
            failed += not rel <= param_tol
            if worst is None or rel > worst[0]:
                worst = (rel, name + at, detail)
    rel, name, detail = worst
    return failed, (f"{'':<64} {what}: worst {name} rel {rel:.2e} ({detail}); "
                    f"{total - failed}/{total} tensors within {param_tol:g}  {'yes' if not failed else 'NO'}")


def compare_bf16(pairs, what, param_tol, names):
    """compare()'s bf16 form: each tensor's distance from PyTorch's f32 step, ingot's against
    max(P, 2 x PyTorch bf16's); the worst ratio of ingot's to PyTorch's is printed."""
    failed, worst, total, worst_torch, worst_ingot = 0, None, 0, 0.0, (0.0, "")
    for step, a_path, b_path, f_path in pairs:
        a, b, f = (load_safetensors(p, names) for p in (a_path, b_path, f_path))
        at = f" after step {step}"
        if set(a) != set(b) or set(b) != set(f):
            return failed + 1, (f"{'':<64} {what}{at}: ingot saved {sorted(a)}, torch bf16 {sorted(b)}, "
                                f"torch f32 {sorted(f)}  NO")
        for name in sorted(b):
            total += 1
            ri, _ = rel_diff(a[name], f[name])
            rt, _ = rel_diff(b[name], f[name])
            worst_torch = max(worst_torch, rt)
            worst_ingot = max(worst_ingot, (ri, name + at))
            ok = ri <= max(param_tol, 2 * rt)
            failed += not ok
            ratio = ri / max(rt, 1e-12)
            if worst is None or (not ok, ratio) > worst[:2]:
                worst = (not ok, ratio, name + at, ri, rt)
    bad, ratio, name, ri, rt = worst
    return failed, (f"{'':<64} {what}, distance from torch f32: worst ingot/torch-bf16 ratio {ratio:.2f} "
                    f"at {name} (ingot {ri:.2e}, torch {rt:.2e}); ingot's worst {worst_ingot[0]:.2e} at "
                    f"{worst_ingot[1]}, torch's worst {worst_torch:.2e}; "
                    f"{total - failed}/{total} tensors within max({param_tol:g}, 2x torch's)  "
                    f"{'yes' if not failed else 'NO'}")

failed = 0
print(f"ingot on {ingot_device}, torch on {device}, {steps} steps")
print(f"{'model':<64} {'step':>4} {'ingot':>14} {'torch':>14} {'rel diff':>10}  ok")
for d in sorted(os.listdir(work), key=int):
    model = open(os.path.join(work, d, "model")).read().strip()
    a = losses(os.path.join(work, d, "ingot.jsonl"))
    b = losses(os.path.join(work, d, "torch.jsonl"))
    if len(a) != steps or len(b) != steps:
        print(f"{model:<64} expected {steps} losses, ingot printed {len(a)} and torch {len(b)}")
        failed += 1
        continue
    anchored = os.path.exists(os.path.join(work, d, "mode"))
    # bf16 anchored: PyTorch's f32 loss on the same state, the yardstick.
    f32_path = os.path.join(work, d, "torch32.jsonl")
    f = losses(f32_path) if os.path.exists(f32_path) else [None] * len(b)
    for s, (x, y, z) in enumerate(zip(a, b, f), 1):
        rel = abs(x - y) / max(abs(y), 1e-12)
        ok = rel <= tol  # NaN compares false: a NaN loss fails
        note = ""
        if z is not None:
            ri, rt = abs(x - z) / max(abs(z), 1e-12), abs(y - z) / max(abs(z), 1e-12)
            ok = ok or ri <= max(tol, 2 * rt)
            note = f"  (from torch f32 {z:.8f}: ingot {ri:.2e}, torch bf16 {rt:.2e})"
        failed += not ok
        name = (model + (" (anchored)" if anchored else "")) if s == 1 else ""
        print(f"{name:<64} {s:>4} {x:>14.8f} {y:>14.8f} {rel:>10.2e}  {'yes' if ok else 'NO'}{note}")
    pairs = {}
    with open(os.path.join(work, d, "pairs")) as f:
        for line in f:
            what, step, *files = line.split()
            files = [os.path.join(work, d, f) for f in files] + [None]
            pairs.setdefault(what, []).append((int(step), files[0], files[1], files[2]))
    # Ingot's --save of a model with batch norms is a whole state_dict (running statistics and
    # num_batches_tracked too); torch_reference.py's holds the parameters alone.
    buffers = ("running_mean", "running_var", "num_batches_tracked")
    checks = (
        ("params", "params", param_tol, lambda k: not k.endswith(buffers)),
        ("state", "running stats", param_tol, lambda k: not k.endswith(".momentum_buffer")),
        ("state", "momentum buffers", momentum_tol, lambda k: k.endswith(".momentum_buffer")),
    )
    for what, label, t, names in checks:
        if what in pairs:
            n, line = compare(pairs[what], label, t, names)
            failed += n
            print(line)
if failed:
    print(f"{failed} losses or parameter (or state) tensors differ by more than {tol:g} (losses) / {param_tol:g} (parameters, running stats) / {momentum_tol:g} (momentum buffers), relative")
    sys.exit(1)
print(f"all losses agree within {tol:g} and all parameters within {param_tol:g} (relative)"
      + (" (bf16 anchored: or as near PyTorch's f32 step as twice PyTorch bf16's distance)"
         if any(os.path.exists(os.path.join(work, d, "torch32.jsonl")) for d in os.listdir(work)) else ""))
EOF
