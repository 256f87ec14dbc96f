#!/usr/bin/env python3
"""One line from `ingot train --json` on stdin: the median step (device) and wall times in ms,
planned and measured bytes, and the last loss. Used by the GPU scripts to tabulate runs;
`read_run` and `json_lines` are what they share (onnx_real_models/compare_bf16.py,
ddp_check.sh)."""
import json
import sys


def json_lines(path):
    """The JSON objects of a log file, one a line; the lines that are not JSON (a progress
    bar, a warning) are passed over."""
    out = []
    for line in open(path):
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def read_run(lines):
    """The losses of a `train --json` run's step lines, in order, and its summary (None when
    the run wrote none)."""
    losses, summary = [], None
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        if "summary" in d:
            summary = d["summary"]
        elif "loss" in d:
            losses.append(d["loss"])
    return losses, summary


if __name__ == "__main__":
    losses, summary = read_run(sys.stdin)
    if summary is None:
        sys.exit("no summary in the input")
    print(
        "step_ms %.3f wall_ms %.3f planned %s measured %s last_loss %s"
        % (
            summary["median_step_seconds"] * 1e3,
            summary["median_wall_seconds"] * 1e3,
            summary.get("planned_bytes"),
            summary.get("measured_bytes"),
            losses[-1] if losses else None,
        )
    )
