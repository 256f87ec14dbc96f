#!/bin/bash
# Compares `ingot plan --json` between two `ingot` binaries, byte for byte, for the models whose
# plans a compile-time change must leave alone (issue 53): mlp, gpt-mini, gpt2, cnn, resnet18
# and resnet:depth=50,side=64,batch=8 on the CPU, CUDA f32 and CUDA bf16, and the narrow GPT
# of the compile-time benchmarks at 100 and 400 layers (CPU; solved problems of more than
# 4,000 buffers, which run the solver's threaded portfolio).
#   scripts/compare_plans_deep.sh OLD_BINARY NEW_BINARY [WORK_DIR]
# Exits 1 if any report differs, naming it and both totals.
set -euo pipefail
old=$1
new=$2
dir=${3:-$(mktemp -d)}
narrow() { echo "gpt:vocab=256,d_model=64,layers=$1,heads=4,d_ff=256,seq=64,batch=8"; }
plans() {
    local bin=$1 out=$2
    mkdir -p "$out"
    for m in mlp gpt-mini gpt2 cnn resnet18 resnet:depth=50,side=64,batch=8; do
        local f=${m//[:=,]/_}
        "$bin" plan --model "$m" --json >"$out/$f-cpu.json"
        "$bin" plan --model "$m" --device cuda --json >"$out/$f-cuda.json"
        "$bin" plan --model "$m" --device cuda --precision bf16 --json >"$out/$f-cuda-bf16.json"
    done
    for l in 100 400; do
        "$bin" plan --model "$(narrow $l)" --json >"$out/narrow-gpt-$l-cpu.json"
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
