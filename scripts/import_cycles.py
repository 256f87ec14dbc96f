#!/usr/bin/env python3
"""File-level import cycles in each crate's `src/` (issue 47's goal: none).

A file is a node; there is an edge from file A to file B when A's code (outside its
`#[cfg(test)] mod tests`, comments dropped) names a path that resolves into B's module: a path
from `crate::`, `super::` or `self::` (in `use` items, their `{..}` groups expanded, globs
such as `use super::*` included, or inline), or, in a module with children (`mod.rs`, `lib.rs`, or `foo.rs` beside a `foo/`
folder), a path through one of its child modules by bare name (`use child::X`, `child::f()`).
A path resolves to the longest module prefix that has a file. A crate with both `lib.rs` and
`main.rs` has `lib.rs` as its root; `main.rs` is a file of its own. Each strongly
connected component of more than one file (Tarjan) is a cycle: its files cannot be read in any
order where each only uses what came before.

  scripts/import_cycles.py                 # list the cycles, exit 0
  scripts/import_cycles.py --known FILE    # exit 1 if a cycle is not in FILE (one line a cycle:
                                           # `crate file file ...`, sorted), or if a line of FILE
                                           # names a cycle that is gone (remove it: the list only
                                           # shrinks)
"""
import os
import re
import sys

sys.setrecursionlimit(100000)


def expand(tree):
    """The paths of a `use` tree: `a::{b, c::{d, e}}` gives a::b, a::c::d, a::c::e (`self`
    in a group names the prefix; `as` renames are dropped)."""
    tree = re.sub(r'\s+', '', re.sub(r'\s+as\s+\w+', '', tree))
    depth, start, parts = 0, 0, []
    i = tree.find('{')
    if i < 0:
        return [tree]
    prefix, body = tree[:i], tree[i + 1:tree.rfind('}')]
    for k, ch in enumerate(body + ','):
        if ch == '{':
            depth += 1
        elif ch == '}':
            depth -= 1
        elif ch == ',' and depth == 0:
            parts.append(body[start:k])
            start = k + 1
    out = []
    for p in parts:
        if not p:
            continue
        for q in expand(p):
            out.append(prefix.rstrip(':') if q == 'self' else prefix + q)
    return out


def crate_cycles(src):
    mods = {}  # module path (tuple) -> file
    for dp, _, fs in os.walk(src):
        for f in fs:
            if not f.endswith('.rs'):
                continue
            parts = os.path.relpath(os.path.join(dp, f), src)[:-3].split(os.sep)
            if parts[0] == 'bin':
                continue
            if parts == ['main'] and os.path.isfile(os.path.join(src, 'lib.rs')):
                parts = ['<main>']
            elif parts[-1] in ('mod', 'lib', 'main'):
                parts = parts[:-1]
            mods[tuple(parts)] = os.path.join(dp, f)
    files = {v: k for k, v in mods.items()}

    def resolve(path):
        for n in range(len(path), -1, -1):
            if tuple(path[:n]) in mods:
                return mods[tuple(path[:n])]
        return None

    edges = {f: set() for f in files}
    for f, m in sorted(files.items()):
        text = re.split(r'#\[cfg\(test\)\]\s*mod tests', open(f).read())[0]
        text = re.sub(r'//[^\n]*', '', text)
        is_dir = os.path.basename(f) in ('mod.rs', 'lib.rs', 'main.rs') or os.path.isdir(f[:-3])
        if m == ('<main>',):
            m = ()
        # `use` items with their groups expanded, one path a line, then every inline path.
        paths = [p for u in re.finditer(r'\buse\s+([^;]+);', text) for p in expand(u.group(1))]
        text = re.sub(r'\buse\s+[^;]+;', ' ', text) + '\n' + '\n'.join(paths)
        # A glob (`use super::*`) uses the module it names: a placeholder item keeps it a path.
        text = text.replace('::*', '::__glob__')
        for mt in re.finditer(r'\b(crate|super|self)((?:::\w+)+)', text):
            head, rest = mt.group(1), mt.group(2).split('::')[1:]
            # `self::` in a module file is the module; `super::` is its parent.
            if head == 'crate':
                path = rest
            elif head == 'self':
                path = list(m) + rest
            else:
                up = 1
                while rest and rest[0] == 'super':
                    rest, up = rest[1:], up + 1
                path = list(m[: max(len(m) - up, 0)]) + rest
            t = resolve(path)
            if t and t != f:
                edges[f].add(t)
        if is_dir:
            for mt in re.finditer(r'(?<![:\w])(\w+)((?:::\w+)+)', text):
                name = mt.group(1)
                if name in ('crate', 'super', 'self', 'std', 'core') or tuple(list(m) + [name]) not in mods:
                    continue
                t = resolve(list(m) + [name] + mt.group(2).split('::')[1:])
                if t and t != f:
                    edges[f].add(t)
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(os.path.relpath(x, src) for x in comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(comps)


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    found = []
    for c in sorted(os.listdir(root)):
        src = os.path.join(root, c, 'src')
        if os.path.isfile(os.path.join(root, c, 'Cargo.toml')) and os.path.isdir(src):
            found += [' '.join([c] + comp) for comp in crate_cycles(src)]
    if len(sys.argv) == 3 and sys.argv[1] == '--known':
        known = [l.strip() for l in open(sys.argv[2]) if l.strip() and not l.startswith('#')]
        new = [c for c in found if c not in known]
        gone = [k for k in known if k not in found]
        for c in new:
            print('new import cycle:', c)
        for k in gone:
            print('no longer a cycle (remove it from %s): %s' % (sys.argv[2], k))
        print('%d file-level import cycles, %d known, %d new, %d gone' % (len(found), len(known), len(new), len(gone)))
        return 1 if new or gone else 0
    for c in found:
        print(c)
    print('%d file-level import cycles' % len(found))
    return 0


if __name__ == '__main__':
    sys.exit(main())
