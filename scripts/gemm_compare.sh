#!/usr/bin/env bash
# Session 25's GEMM comparison: Ingot's packed GEMM (inside a rayon pool) against faer's `gemm`
# crate (Parallelism::Rayon) and `matrixmultiply` (its own threads) on the shapes of mlp,
# gpt-mini and the README's main job, at 1 and 2 threads (or the counts given), f32, GFLOP/s,
# and whether each gives the same bits on n threads as on one. Built as a throwaway crate
# outside the workspace (in target/gemm_compare), so the workspace does not depend on `gemm`.
#   scripts/gemm_compare.sh [THREADS ...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/target/gemm_compare
mkdir -p "$dir/src"
cp "$root/scripts/gemm_compare/main.rs" "$dir/src/main.rs"
cat > "$dir/Cargo.toml" <<TOML
[package]
name = "gemm_compare"
version = "0.1.0"
edition = "2021"
[dependencies]
gemm = "0.18"
matrixmultiply = { version = "0.3", features = ["threading"] }
rayon = "1"
ingot-kernels = { path = "$root/kernels" }
[workspace]
TOML
(cd "$dir" && cargo build --release --quiet)
for t in "${@:-1 2}"; do
    for n in $t; do
        MATMUL_NUM_THREADS=$n "$dir/target/release/gemm_compare" "$n"
    done
done
