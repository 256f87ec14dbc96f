#!/bin/bash
# Compares `ingot plan --json` of the reference models (mlp, gpt-mini, gpt2, cnn, resnet18; the
# CPU, CUDA f32 and CUDA bf16) between two `ingot` binaries, byte for byte: a change that
# should leave every plan alone (compile time, say) is checked with it.
#   scripts/compare_plans.sh OLD_BINARY NEW_BINARY [WORK_DIR]
# Exits 1 if any report differs, naming it and both totals.
set -euo pipefail
old=$1
new=$2
dir=${3:-$(mktemp -d)}
plans() {
    local bin=$1 out=$2
    mkdir -p "$out"
    for m in mlp gpt-mini gpt2 cnn resnet18; do
        "$bin" plan --model "$m" --json >"$out/$m-cpu.json"
        "$bin" plan --model "$m" --device cuda --json >"$out/$m-cuda.json"
        "$bin" plan --model "$m" --device cuda --precision bf16 --json >"$out/$m-cuda-bf16.json"
    done
}
plans "$old" "$dir/old"
plans "$new" "$dir/new"
status=0
for f in "$dir"/old/*.json; do
    name=$(basename "$f")
    if cmp -s "$f" "$dir/new/$name"; then
        echo "same  $name"
    else
        totals=$(python3 -c "import json,sys; print(*(json.load(open(p))['total_bytes'] for p in sys.argv[1:]))" "$f" "$dir/new/$name")
        echo "DIFF  $name (total bytes old, new: $totals)"
        status=1
    fi
done
exit $status
