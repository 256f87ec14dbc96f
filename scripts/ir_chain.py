"""What the chain writers (chain_ir.py, reduce_chain_ir.py) share: the IR text's head with one
parameter `w` and one input `x`, its tail (the last value summed into the scalar loss), and the
command line `SCRIPT N`. Imported from beside them, as the reference scripts import
safetensors_io."""

import sys


def head(what, script, w_init, t):
    """The first lines: the version, a comment naming the chain, `w` (%0) and `x` (%1), of
    type `t`."""
    return [
        "ingot-ir 1",
        f"# a chain of {what} ({script})",
        f'%0 = parameter "w" init={w_init} : {t}',
        f'%1 = input "x" : {t}',
    ]


def finish(lines, prev, node, axes, summed):
    """`lines` with value %`prev` summed over `axes` into %`node` (of type `summed`), reshaped
    into the scalar loss: the whole text."""
    lines.append(f"%{node} = reduce_sum(%{prev}) axes={axes} : {summed}")
    lines.append(f"%{node + 1} = reshape(%{node}) : f32[]")
    lines.append(f'output "loss" = %{node + 1}')
    return "\n".join(lines) + "\n"


def main(chain, script):
    """`SCRIPT N`: the chain of `N` written to stdout."""
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit(f"usage: {script} N")
    sys.stdout.write(chain(int(sys.argv[1])))
