#!/usr/bin/env bash
# scripts/cpu_bench.py at 2 threads and at every core, tables into target/cpu_bench/.
#   BIN=target/release/ingot scripts/cpu_bench.sh [extra cpu_bench.py arguments]
set -euo pipefail
: "${BIN:?set BIN to the ingot binary, e.g. BIN=target/release/ingot}"
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT_DIR:-target/cpu_bench}
mkdir -p "$out"
cores=$(nproc)
status=0
for t in 2 "$cores"; do
    python3 "$here/cpu_bench.py" --threads "$t" --json "$out/threads$t.json" --md "$out/threads$t.md" "$@" || status=1
done
exit $status
