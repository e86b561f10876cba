#!/usr/bin/env python3
"""check_cycles.py BUILD_DIR FOLDER... - no circle of calls between the files of a folder.

For each FOLDER (a source folder such as runtime/train), reads the objects
BUILD_DIR/FOLDER/*.o with nm: file A depends on file B when A uses a symbol that B
defines. A cycle (A -> B -> ... -> A) means the files cannot be read or changed one
after another, and fails the check (exit 1), naming the files and one symbol per
arrow. Exit 2: no objects (build first). Used by tests/integration/test_layers.sh.
"""
import os, subprocess, sys


def symbols(obj):
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            used.add(name)
        elif kind in "TDBRVWGC":  # defined: text, data, bss, read-only, weak, common
            defined.add(name)
    return defined, used


def cycles(graph):
    """Tarjan's strongly connected components of size > 1 (or a self edge)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1
        stack.append(v); on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip(), file=sys.stderr); return 2
    build, bad = sys.argv[1], 0
    for folder in sys.argv[2:]:
        d = os.path.join(build, folder)
        objs = sorted(f for f in os.listdir(d) if f.endswith(".o")) if os.path.isdir(d) else []
        if not objs:
            print(f"check_cycles: no objects in {d} (build first)", file=sys.stderr); return 2
        syms = {o[:-2]: symbols(os.path.join(d, o)) for o in objs}
        owner = {s: f for f, (defs, _) in syms.items() for s in defs}
        graph, why = {f: set() for f in syms}, {}
        for f, (_, used) in syms.items():
            for s in sorted(used):
                g = owner.get(s)
                if g and g != f:
                    graph[f].add(g); why.setdefault((f, g), s)
        for comp in cycles(graph):
            bad += 1
            arrows = [f"{a} -> {b} ({why[(a, b)]})" for a in comp for b in comp if (a, b) in why]
            print(f"call cycle in {folder}/: {', '.join(comp)}: " + "; ".join(arrows))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
