#!/bin/bash
# Compares `ingot plan --json` of the reference models (mlp, gpt-mini, gpt2, cnn, resnet18; the
# CPU, CUDA f32 and CUDA bf16) between two `ingot` binaries, byte for byte: a change that
# should leave every plan alone (compile time, say) is checked with it. With DEEP=1 also
# resnet:depth=50,side=64,batch=8 on the three targets and the narrow GPT of the compile-time
# benchmarks at 100 and 400 layers on the CPU (solved problems of more than 4,000 buffers, which
# run the solver's threaded portfolio).
#   [DEEP=1] scripts/compare_plans.sh OLD_BINARY NEW_BINARY [WORK_DIR]
# Exits 1 if any report differs, naming it and both totals.
set -euo pipefail
old=$1
new=$2
dir=${3:-$(mktemp -d)}
models=(mlp gpt-mini gpt2 cnn resnet18)
if [ "${DEEP:-0}" = 1 ]; then
    models+=(resnet:depth=50,side=64,batch=8)
fi
narrow() { echo "gpt:vocab=256,d_model=64,layers=$1,heads=4,d_ff=256,seq=64,batch=8"; }
plans() {
    local bin=$1 out=$2
    mkdir -p "$out"
    for m in "${models[@]}"; do
        local f=${m//[:=,]/_}
        "$bin" plan --model "$m" --json >"$out/$f-cpu.json"
        "$bin" plan --model "$m" --device cuda --json >"$out/$f-cuda.json"
        "$bin" plan --model "$m" --device cuda --precision bf16 --json >"$out/$f-cuda-bf16.json"
    done
    if [ "${DEEP:-0}" = 1 ]; then
        for l in 100 400; do
            "$bin" plan --model "$(narrow $l)" --json >"$out/narrow-gpt-$l-cpu.json"
        done
    fi
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
