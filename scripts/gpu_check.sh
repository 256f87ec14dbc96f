#!/usr/bin/env bash
# The GPU checks and figures of the CUDA backend, in one run, on a machine with an NVIDIA GPU and
# no Rust toolchain: everything runs from binaries built elsewhere.
#
#   scripts/gpu_build.sh              # here: builds the binaries into .devbin/
#   scripts/gpu_check.sh .devbin OUT [PART ...]
#
# PARTs (default: tests train compare): tests (every GPU test binary, .devbin/test_*, one test at
# a time: cli/tests/cuda.rs, GPU vs CPU over 10 steps, zero allocation over 1000 steps,
# TF32; testkit/tests/cuda_kernels.rs, every distinct kernel of mlp, gpt-mini and gpt2 and 300
# random kernels against the CPU, in place too; and any other <crate>/tests/cuda*.rs), kernels
# (the kernel timings, each kernel checked on the way: testkit/examples/cuda_kernels.rs), train
# (`ingot train --device cuda` on each model, strict f32 and TF32), compare (losses and
# parameters against PyTorch on the GPU), bf16 (gpt-mini and gpt2 trained with --precision bf16;
# gpt-mini's 20 losses against PyTorch under bf16 autocast, within 1%), bench (the side by side benchmark against PyTorch and
# JAX). Logs go to OUT/*.txt.
#
# INGOT_REQUIRE_GPU=1 is set for everything: a GPU test that finds no usable GPU fails instead
# of skipping, so a broken driver cannot pass as a green run.
set -uo pipefail
BIN=$1; OUT=$2; shift 2
PARTS=("$@"); [[ ${#PARTS[@]} -gt 0 ]] || PARTS=(tests train compare)
export INGOT_REQUIRE_GPU=1
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
status=0
run() { # name, command...
    local name=$1; shift
    echo "== $name: $*"
    local t0=$SECONDS
    "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    tail -n "${TAIL:-25}" "$OUT/$name.txt"
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
    [[ $rc -eq 0 ]] || status=1
}
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$OUT/gpu.txt"
for part in "${PARTS[@]}"; do
    case $part in
        kernels) run kernels "$BIN/cuda_kernels" mlp gpt-mini gpt2 ;;
        tests)
            found=0
            for t in "$BIN"/test_*; do
                [[ -x $t ]] || continue
                found=1
                run "$(basename "$t")" "$t" --test-threads=1 --nocapture
            done
            [[ $found -eq 1 ]] || { echo "no test binaries in $BIN (run scripts/gpu_build.sh)"; status=1; } ;;
        train)
            for m in mlp gpt-mini gpt2; do
                run "train_${m}_f32" "$BIN/ingot" train --model "$m" --device cuda --steps 30
                run "train_${m}_tf32" "$BIN/ingot" train --model "$m" --device cuda --steps 30 --tf32
            done ;;
        compare) run compare "$HERE/compare_torch.sh" "$BIN/ingot" --device cuda --ingot-device cuda --steps 10 mlp gpt-mini ;;
        bf16)
            for m in gpt-mini gpt2; do
                run "train_${m}_bf16" "$BIN/ingot" train --model "$m" --device cuda --steps 30 --precision bf16
            done
            run compare_bf16 "$HERE/compare_torch.sh" "$BIN/ingot" --device cuda --ingot-device cuda --steps 20 --precision bf16 gpt-mini ;;
        bench) run bench python3 "$HERE/gpu_bench.py" --ingot "$BIN/ingot" --json "$OUT/bench.json" ;;
        *) echo "unknown part $part"; status=2 ;;
    esac
done
exit $status
