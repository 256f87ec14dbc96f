#!/bin/bash
# Builds the five libFuzzer targets of fuzz/ as `cargo fuzz build` would (nightly rustc with
# cargo-fuzz's instrumentation flags: sancov module pass, inline 8-bit counters, pc table,
# trace-compares; `--cfg fuzzing`, debug assertions and overflow checks; no sanitizer), for a
# machine without cargo-fuzz, and packs them for a fuzzing run elsewhere with fuzz/run.sh's
# layout: PACK/bin/<target>. The build directory is kept between runs (incremental).
#   scripts/fuzz_build.sh BUILD_DIR PACK_DIR
set -euo pipefail
build=${1:?build dir}
pack=${2:?pack dir}
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
cargo +nightly build --manifest-path fuzz/Cargo.toml --release --target x86_64-unknown-linux-gnu \
    --target-dir "$build" --bins
mkdir -p "$pack/bin"
for t in ir_text executable safetensors plan_validate fused_step; do
    cp "$build/x86_64-unknown-linux-gnu/release/$t" "$pack/bin/$t"
    strip "$pack/bin/$t"
done
ls -la "$pack/bin"
