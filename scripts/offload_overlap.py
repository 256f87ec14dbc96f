#!/usr/bin/env python3
"""How far a CUDA step executable's offload copies may run ahead of the compute (issue 51).

    python3 scripts/offload_overlap.py step.ingot

Reads the executable's JSON payload (after its 28-byte header) and prints, from the program's
dependency lists: how many device operations there are and where the first copy in sits; for
each copy in, how many operations before it its latest dependency is (how far ahead of its
program position the graph lets it start), how many after it the first operation waiting on
it is, and the operations between the two (what the copy may overlap); and how many copies out
something later waits on (a later owner of their bytes).
"""
import json
import statistics
import sys

HEADER = 28


def main(path):
    payload = json.loads(open(path, "rb").read()[HEADER:])
    prog = payload["program"]["cuda"]
    ops, deps = prog["ops"], prog["deps"]
    n = len(ops)
    ins = [i for i, o in enumerate(ops) if "copy_in" in o]
    outs = [i for i, o in enumerate(ops) if "copy_out" in o]
    if not ins:
        sys.exit("the program has no offload copies")
    waiters = [[] for _ in range(n)]
    for j, d in enumerate(deps):
        for i in d:
            waiters[i].append(j)
    ahead = [i - max(deps[i], default=-1) for i in ins]
    reader = [min(waiters[i]) - i for i in ins if waiters[i]]
    # The window the graph gives a copy in: from just after its latest dependency (where its
    # staging bytes are free) to the first operation waiting on it (its first reader).
    window = [min(waiters[i]) - max(deps[i], default=-1) - 1 for i in ins if waiters[i]]
    stats = lambda xs: "min %d median %g max %d" % (min(xs), statistics.median(xs), max(xs))
    print("%d operations, host region %d bytes, %d copies in, %d out" % (n, prog.get("host_bytes", 0), len(ins), len(outs)))
    print("first copy in: operation %d" % ins[0])
    print("copy in after its latest dependency by (operations): " + stats(ahead))
    print("copy in before the first operation waiting on it by: " + stats(reader))
    print("operations a copy in may overlap (free bytes to first reader): " + stats(window))
    waited = [min(waiters[i]) - i for i in outs if waiters[i]]
    print("copies out something later waits on: %d of %d" % (len(waited), len(outs)))
    if waited:
        print("copy out before the first operation waiting on it by: " + stats(waited))


if __name__ == "__main__":
    main(sys.argv[1])
