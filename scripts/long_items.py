#!/usr/bin/env python3
"""Issue 47's size goals for production code: no function over 200 lines, no file over 1,500.

Reads every `*.rs` under a crate's `src/` (tests/, examples/ and benches/ are not production
code; neither are `tests.rs` files nor `#[cfg(test)] mod ... { }` blocks, whose functions are
skipped; the generated ONNX protobuf bindings are skipped whole). A function's length runs from
its `fn` line to its closing brace. Braces are matched on the text with comments, strings and
character literals blanked, which is enough for this code base (no brace in a lifetime or a
macro's token tree that is not balanced).

    python3 scripts/long_items.py [--functions N] [--files N]

Prints each item over its limit (`lines path:line name`) and exits 1 if there is one.
"""
import argparse
import bisect
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SKIP = {"onnx/src/proto/onnx.rs"}


def blank(src):
    """`src` with comments, strings and character literals replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i) + 2
        elif (m := re.match(r'b?r(#*)"', src[i : i + 12])) and not (
            i and (src[i - 1].isalnum() or src[i - 1] == "_")
        ):
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0))) + len(end)
        elif src[i] == '"' or src.startswith('b"', i):
            j = i + (2 if src[i] == "b" else 1)
            while src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
        elif m := re.match(r"b?'(\\.|\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|[^\\'])'", src[i : i + 12]):
            j = i + len(m.group(0))
        else:
            out.append(src[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", src[i:j]))
        i = j
    return "".join(out)


def block_end(s, open_at):
    depth = 0
    for k in range(open_at, len(s)):
        if s[k] == "{":
            depth += 1
        elif s[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(s) - 1


def long_functions(path, limit):
    s = blank(path.read_text())
    starts = [0]
    for line in s.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    line_of = lambda at: bisect.bisect_right(starts, at)
    test_spans = [
        (m.start(), block_end(s, m.end() - 1))
        for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))?\s+)?mod\s+\w+\s*\{", s)
    ]
    for m in re.finditer(r"\bfn\s+(\w+)", s):
        if any(a <= m.start() <= b for a, b in test_spans):
            continue
        k, depth = m.end(), 0
        while k < len(s) and s[k] not in "{;":
            k += 1
        if k >= len(s) or s[k] == ";":
            continue  # a declaration without a body
        lines = line_of(block_end(s, k)) - line_of(m.start()) + 1
        if lines > limit:
            yield lines, line_of(m.start()), m.group(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--functions", type=int, default=200)
    ap.add_argument("--files", type=int, default=1500)
    args = ap.parse_args()
    found = []
    for path in sorted(ROOT.glob("*/src/**/*.rs")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in SKIP or rel.startswith(("target/", "fuzz/")) or path.name == "tests.rs":
            continue
        n = path.read_text().count("\n")
        if n > args.files:
            found.append(f"{n:5} {rel} (file)")
        for lines, at, name in long_functions(path, args.functions):
            found.append(f"{lines:5} {rel}:{at} {name}")
    for f in found:
        print(f)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
