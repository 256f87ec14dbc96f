#!/usr/bin/env python3
"""Writes a chain of N elementwise ops in Ingot's IR text form (compiler/src/ir/text.rs), for
measuring compile time against graph size (docs/benchmarks.md, "Compile time").

    scripts/chain_ir.py 10000 > /tmp/chain10000.ir
    ingot plan --model-file /tmp/chain10000.ir

The chain alternates tanh and a product with one parameter, so that every op has a gradient and
egg has nothing to fold away; the loss is the sum of the last value.
"""
import sys


def chain(n: int) -> str:
    lines = [
        "ingot-ir 1",
        f"# a chain of {n} elementwise ops (scripts/chain_ir.py)",
        '%0 = parameter "w" init=normal(0.5) : f32[64]',
        '%1 = input "x" : f32[64]',
    ]
    prev = 1
    for i in range(n):
        node = i + 2
        if i % 2 == 0:
            lines.append(f"%{node} = mul(%{prev}, %0) : f32[64]")
        else:
            lines.append(f"%{node} = tanh(%{prev}) : f32[64]")
        prev = node
    node = n + 2
    lines.append(f"%{node} = reduce_sum(%{prev}) axes=[0] : f32[1]")
    lines.append(f"%{node + 1} = reshape(%{node}) : f32[]")
    lines.append(f'output "loss" = %{node + 1}')
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit("usage: chain_ir.py N")
    sys.stdout.write(chain(int(sys.argv[1])))
