#!/usr/bin/env bash
# Builds what scripts/gpu_check.sh runs on a GPU machine into .devbin/ (git-ignored): the ingot
# program, the kernel timing and profiling programs (testkit/examples/cuda_kernels.rs,
# trainer/examples/cuda_profile.rs, runtime/examples/attention_bench.rs) and every GPU test
# binary of the runtime, trainer, command line and test kit (<crate>/tests/cuda*.rs, as
# .devbin/test_<name>; the names are unique across the crates), and scripts/summ.py, which
# sums up a `train --json` run in one line.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .devbin
mkdir -p .devbin
cargo build --release -p ingot --bin ingot
cargo build --release -p ingot-testkit --example cuda_kernels
cargo build --release -p ingot-trainer --example cuda_profile
cargo build --release -p ingot-runtime --example attention_bench
cp target/release/ingot target/release/examples/cuda_kernels target/release/examples/cuda_profile target/release/examples/attention_bench .devbin/
# (folder, package) of each crate with GPU tests.
crates=("runtime ingot-runtime" "trainer ingot-trainer" "cli ingot" "testkit ingot-testkit")
tests=$(for c in "${crates[@]}"; do ls ${c%% *}/tests/cuda*.rs; done | xargs -n1 basename | sed 's/\.rs$//')
for c in "${crates[@]}"; do
  args=(); for t in $(ls ${c%% *}/tests/cuda*.rs | xargs -n1 basename | sed 's/\.rs$//'); do args+=(--test "$t"); done
  cargo test --release -p "${c##* }" "${args[@]}" --no-run --message-format=json 2>/dev/null
done | python3 -c 'import json,sys,shutil
want = set(sys.argv[1:])
for l in sys.stdin:
    m = json.loads(l)
    t = m.get("target", {})
    if m.get("reason") == "compiler-artifact" and t.get("name") in want and "test" in t.get("kind", []) and m.get("executable"):
        shutil.copy(m["executable"], ".devbin/test_" + t["name"])
        want.discard(t["name"])
sys.exit("test binaries not found: %s" % sorted(want) if want else 0)' $tests
strip .devbin/*  # debug info would exceed what a device call carries
cp scripts/summ.py .devbin/  # one line per `ingot train --json` run, for the device scripts
ls -la .devbin
