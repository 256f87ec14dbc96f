#!/usr/bin/env bash
# Builds what scripts/gpu_check.sh runs on a GPU machine into .devbin/ (git-ignored): the ingot
# program, the per-kernel check (runtime/examples/cuda_kernels.rs) and the GPU test binary
# (runtime/tests/cuda.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devbin
cargo build --release -p ingot-runtime --bin ingot --example cuda_kernels --example cuda_profile
cp target/release/ingot target/release/examples/cuda_kernels target/release/examples/cuda_profile .devbin/
test=$(cargo test --release -p ingot-runtime --test cuda --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cuda" and m.get("executable"):
        print(m["executable"])')
cp "$test" .devbin/cuda_test
strip .devbin/*  # debug info would exceed what a device call carries
ls -la .devbin
