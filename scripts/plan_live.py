#!/usr/bin/env python3
"""Live slab bytes at each schedule position of a plan, with and without its workspaces.

Reads the plan data an `ingot plan ... --html PAGE.html` page embeds (every buffer's kind,
size and lifetime) and prints the peak of the live slab bytes counting every buffer, the peak
counting all but workspaces (what the step needs besides its kernels' scratch: where a
workspace is the peak, the plan's next limit), and the largest buffers live at a position (the
second peak's unless one is given). Exact for the plan's own schedule: no buffer is estimated.

    python3 scripts/plan_live.py PAGE.html [POSITION]
"""

import json
import re
import sys

RESIDENT = {"parameter", "optimizer_state", "input", "weight_copies"}


def main():
    page = open(sys.argv[1]).read()
    m = re.search(r'<script type="application/json" id="plan-data">(.*?)</script>', page, re.S)
    if not m:
        sys.exit(f"{sys.argv[1]}: no plan data (write the page with `ingot plan --html`)")
    d = json.loads(m.group(1))
    names, kinds = d["strings"], d["kinds"]
    n = d["positions"]
    bufs = []
    for prov, kind, dtype, shape, size, start, end, _off, node, op, _ in d["buffers"]:
        if kinds[kind] in RESIDENT:
            continue
        bufs.append((names[prov], kinds[kind], names[dtype], names[shape], size, start, end, node, names[op]))
    every, besides = [0] * n, [0] * n
    for _p, kind, _d, _s, size, start, end, *_ in bufs:
        for p in range(start, min(end, n)):
            every[p] += size
            if kind != "workspace":
                besides[p] += size
    mib = 1 << 20
    top = max(range(n), key=lambda p: (every[p], -p))
    low = max(range(n), key=lambda p: (besides[p], -p))
    print(f"peak of live slab bytes: {every[top]} ({every[top] / mib:.2f} MiB) at position {top}")
    print(f"peak without workspaces: {besides[low]} ({besides[low] / mib:.2f} MiB) at position {low}")
    at = int(sys.argv[2]) if len(sys.argv) > 2 else low
    print(f"largest buffers live at position {at}:")
    live = [b for b in bufs if b[5] <= at < b[6]]
    for prov, kind, dtype, shape, size, start, end, node, op in sorted(live, key=lambda b: -b[4])[:20]:
        print(f"  {prov[:44]:44} %{node:<5} {op:18} {kind:16} {dtype}{shape:20} {size / mib:8.2f} MiB [{start}, {end})")


if __name__ == "__main__":
    main()
