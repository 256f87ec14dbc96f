#!/usr/bin/env python3
"""One line from `ingot train --json` on stdin: the median step (device) and wall times in ms,
planned and measured bytes, and the last loss. Used by the GPU scripts to tabulate runs."""
import json
import sys

last, summary = None, None
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    if "summary" in d:
        summary = d["summary"]
    elif "loss" in d:
        last = d
if summary is None:
    sys.exit("no summary in the input")
print(
    "step_ms %.3f wall_ms %.3f planned %s measured %s last_loss %s"
    % (
        summary["median_step_seconds"] * 1e3,
        summary["median_wall_seconds"] * 1e3,
        summary.get("planned_bytes"),
        summary.get("measured_bytes"),
        last and last.get("loss"),
    )
)
