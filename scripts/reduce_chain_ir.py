#!/usr/bin/env python3
"""Writes a chain of N reduce/broadcast layers in Ingot's IR text form, for measuring compile
time and fusion's scratch bytes against depth (docs/benchmarks.md, "Compile time in depth").

    scripts/reduce_chain_ir.py 2000 > /tmp/rchain2000.ir
    ingot plan --timings --model-file /tmp/rchain2000.ir

Each layer centres its rows (the row mean broadcast back and subtracted, as a LayerNorm does),
scales by one parameter and squashes by tanh (values stay finite at any depth), so every layer
is a reduction that feeds the next layer's elementwise ops; the loss is the sum of the last
value (the same chain as ir-tests/src/chains.rs writes).
"""
import ir_chain


def chain(n: int, rows: int = 8, cols: int = 8) -> str:
    t = f"f32[{rows},{cols}]"
    what = f"{n} reduce/broadcast layers"
    lines = ir_chain.head(what, "scripts/reduce_chain_ir.py", "normal(1.0)", t)
    prev, node = 1, 2
    for _ in range(n):
        lines.append(f"%{node} = reduce_sum(%{prev}) axes=[1] : f32[{rows},1]")
        lines.append(f"%{node + 1} = full value={1.0 / cols!r} : f32[{rows},1]")
        lines.append(f"%{node + 2} = mul(%{node}, %{node + 1}) : f32[{rows},1]")
        lines.append(f"%{node + 3} = broadcast(%{node + 2}) : {t}")
        lines.append(f"%{node + 4} = sub(%{prev}, %{node + 3}) : {t}")
        lines.append(f"%{node + 5} = mul(%{node + 4}, %0) : {t}")
        lines.append(f"%{node + 6} = tanh(%{node + 5}) : {t}")
        prev, node = node + 6, node + 7
    return ir_chain.finish(lines, prev, node, "[0,1]", "f32[1,1]")


if __name__ == "__main__":
    ir_chain.main(chain, "reduce_chain_ir.py")
