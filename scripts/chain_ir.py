#!/usr/bin/env python3
"""Writes a chain of N elementwise ops in Ingot's IR text form (compiler/src/ir/text.rs), for
measuring compile time against graph size (docs/benchmarks.md, "Compile time").

    scripts/chain_ir.py 10000 > /tmp/chain10000.ir
    ingot plan --model-file /tmp/chain10000.ir

The chain alternates tanh and a product with one parameter, so that every op has a gradient and
egg has nothing to fold away; the loss is the sum of the last value.
"""
import ir_chain


def chain(n: int) -> str:
    lines = ir_chain.head(f"{n} elementwise ops", "scripts/chain_ir.py", "normal(0.5)", "f32[64]")
    prev = 1
    for i in range(n):
        node = i + 2
        if i % 2 == 0:
            lines.append(f"%{node} = mul(%{prev}, %0) : f32[64]")
        else:
            lines.append(f"%{node} = tanh(%{prev}) : f32[64]")
        prev = node
    return ir_chain.finish(lines, prev, n + 2, "[0]", "f32[1]")


if __name__ == "__main__":
    ir_chain.main(chain, "chain_ir.py")
