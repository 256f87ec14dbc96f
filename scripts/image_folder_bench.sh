#!/usr/bin/env bash
# Training from an image folder against training on one fixed batch (issue 48's goal: within 3%
# of the fixed batch's step time). Runs `ingot train` twice with the same model and flags, once
# on its synthetic fixed batch and once over DIR, and prints the median step-to-step interval
# of each (the JSON lines' interval_seconds: the step, the batch's copy and any wait for the
# loader), after the first WARMUP steps.
#
#   scripts/image_folder_bench.sh MODEL DIR [STEPS] [-- MORE INGOT FLAGS]
#   scripts/image_folder_bench.sh resnet18 /tmp/imgs10 300 -- --device cuda --precision bf16
#
# DIR: scripts/make_image_folder.py DIR --classes N (N the model's classes). INGOT defaults
# to target/release/ingot.
set -euo pipefail
model=$1 dir=$2 steps=${3:-300}
shift $(( $# < 3 ? $# : 3 ))
[[ ${1:-} == -- ]] && shift
ingot=${INGOT:-target/release/ingot}
warmup=${WARMUP:-50}
median() {
  python3 -c '
import json, statistics, sys
warmup = int(sys.argv[1])
lines = [json.loads(l) for l in sys.stdin if l.startswith("{")]
iv = [l["interval_seconds"] for l in lines if "interval_seconds" in l][warmup:]
summary = [l["summary"] for l in lines if "summary" in l]
skipped = summary[0].get("skipped_images") if summary else None
print(f"{statistics.median(iv) * 1e3:.3f}", len(iv), skipped)
' "$warmup"
}
read -r fixed nf _ < <("$ingot" train --model "$model" --steps "$steps" --json "$@" | median)
read -r folder nd skipped < <("$ingot" train --model "$model" --steps "$steps" --json --dataset "$dir" "$@" | median)
echo "fixed batch:  median interval $fixed ms over $nf steps"
echo "image folder: median interval $folder ms over $nd steps (skipped images: $skipped)"
python3 -c "import sys; f, d = map(float, sys.argv[1:]); print(f'image folder / fixed batch: {d / f:.3f} (goal: at most 1.03)')" "$fixed" "$folder"
