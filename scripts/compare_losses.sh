#!/bin/bash
# Trains the reference models on the CPU with two `ingot` binaries and compares every step's
# loss to the bit (the `--json` lines' "loss" fields as printed, which round-trip f32): a change
# that should leave the numbers alone (a refactor, issue 47) is checked with it, beside
# scripts/compare_plans.sh for the plans. gpt2 runs at batch 1 and seq 128 (its full shape is
# minutes a step on this machine's CPU); STEPS (default 30) steps each, 2 threads unless
# THREADS is set.
#   [STEPS=N] [THREADS=N] scripts/compare_losses.sh OLD_BINARY NEW_BINARY [WORK_DIR]
# Exits 1 if any model's losses differ, naming the first step that does.
set -euo pipefail
old=$1
new=$2
dir=${3:-$(mktemp -d)}
steps=${STEPS:-30}
threads=${THREADS:-2}
models=(mlp gpt-mini cnn resnet18 "gpt:vocab=50257,d_model=768,layers=12,heads=12,d_ff=3072,seq=128,batch=1")
losses() {
    local bin=$1 out=$2
    mkdir -p "$out"
    for m in "${models[@]}"; do
        local f=${m//[:=,]/_}
        "$bin" train --model "$m" --steps "$steps" --threads "$threads" --json |
            python3 -c 'import json,sys
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{") and "loss" in l:
        d=json.loads(l)
        if "step" in d: print(d["step"], repr(d["loss"]))' >"$out/$f.txt"
    done
}
losses "$old" "$dir/old"
losses "$new" "$dir/new"
status=0
for f in "$dir"/old/*.txt; do
    name=$(basename "$f" .txt)
    n=$(wc -l <"$f")
    if [ "$n" -lt "$steps" ]; then
        echo "SHORT $name: $n of $steps steps from the old binary"
        status=1
    elif cmp -s "$f" "$dir/new/$name.txt"; then
        echo "same  $name ($n steps, last loss $(tail -1 "$f" | cut -d' ' -f2))"
    else
        first=$(diff <(cat "$f") <(cat "$dir/new/$name.txt") | grep -m1 '^<' || true)
        echo "DIFF  $name (first differing step, old: ${first#< })"
        status=1
    fi
done
exit $status
