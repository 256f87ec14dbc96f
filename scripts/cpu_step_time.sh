#!/usr/bin/env bash
# Median CPU step time of `ingot train` over 20 steps after one warm-up step.
#   scripts/cpu_step_time.sh path/to/ingot MODEL [MODEL ...]
set -euo pipefail
INGOT=$1; shift
for model in "$@"; do
    "$INGOT" train --model "$model" --steps 21 --json \
        | python3 -c '
import json, statistics, sys
rows = [r for r in (json.loads(l) for l in sys.stdin if l.strip()) if "loss" in r]
t = sorted(r["seconds"] for r in rows[1:])
first, last = rows[0]["loss"], rows[-1]["loss"]
print(f"| {sys.argv[1]} | {statistics.median(t) * 1e3:.1f} | {t[0] * 1e3:.1f} | {t[-1] * 1e3:.1f} | {first:.4f} | {last:.4f} |")
' "$model"
done
