#!/usr/bin/env bash
# Issue 18's GPU check: gpt-mini over a token file of a few million tokens for 3 epochs, free
# device memory at each epoch's end, beside a plain PyTorch loop over the same data; and the
# step-time cost of the data path (real batches against the same step on one fixed batch).
#
#   scripts/data_path_check.sh [INGOT] [OUT_DIR]
#
# INGOT: the ingot binary (default target/release/ingot). Needs a GPU; torch for the PyTorch side.
set -euo pipefail
INGOT=${1:-target/release/ingot}
OUT=${2:-data-path-check}
MODEL=${MODEL:-gpt-mini}
mkdir -p "$OUT"
# A few million byte-level tokens from the repository's own text, repeated.
if [ ! -f "$OUT/train.bin" ]; then
  : > "$OUT/text.txt"
  while [ "$(stat -c %s "$OUT/text.txt")" -lt 3000000 ]; do
    cat README.md docs/*.md >> "$OUT/text.txt"
  done
  "$INGOT" data bytes "$OUT/text.txt" "$OUT/train.bin"
fi
# gpt-mini's vocabulary is larger than 256: byte tokens are valid ids for it.
"$INGOT" train --model "$MODEL" --dataset "$OUT/train.bin" --epochs 3 --order sequential \
  --device cuda --json --report "$OUT/run.html" > "$OUT/ingot_data.jsonl"
grep epoch_end "$OUT/ingot_data.jsonl"
STEPS=$(grep -c '"loss"' "$OUT/ingot_data.jsonl")
"$INGOT" train --model "$MODEL" --steps "$STEPS" --device cuda --json > "$OUT/ingot_fixed.jsonl"
python3 - "$OUT" <<'PY'
import json, sys, statistics
out = sys.argv[1]
def lines(path):
    return [json.loads(l) for l in open(f"{out}/{path}")]
data, fixed = lines("ingot_data.jsonl"), lines("ingot_fixed.jsonl")
dsum, fsum = data[-1]["summary"], fixed[-1]["summary"]
# Step to step on real data, loader waits included: tokens per batch / tokens_per_s.
tok = [l for l in data if "tokens_per_s" in l]
per_batch = dsum.get("staging_bytes", 0) // 2 // 2 // 8  # x + y, i64 ids: tokens per batch
interval = statistics.median(per_batch / l["tokens_per_s"] for l in tok) if per_batch else float("nan")
fwall = fsum["median_wall_seconds"]
print(f"median device step: data {dsum['median_step_seconds']*1e3:.3f} ms, fixed {fsum['median_step_seconds']*1e3:.3f} ms")
print(f"median step-to-step on data (loader waits included) {interval*1e3:.3f} ms vs fixed-batch wall {fwall*1e3:.3f} ms: "
      f"data path cost {100*(interval/fwall-1):+.2f}% (goal: under 2%)")
PY
if python3 -c "import torch" 2>/dev/null; then
  python3 scripts/torch_data_loop.py --model "$MODEL" --dataset "$OUT/train.bin" --epochs 3 | tee "$OUT/torch.jsonl"
fi
