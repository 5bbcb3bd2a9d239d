#!/usr/bin/env python3
"""Fails when core's folders, or its modules, include each other in a cycle (docs/architecture.md, "Pieces").

    core_layers_test.py SOURCE_DIR [--graph]

A folder is core/ops or a folder of core/src. A module is a file stem: x.cpp with the header(s) x.hpp, public
(core/include/kiln/x.hpp) or private (beside x.cpp), and x_impl.hpp. A public header belongs to the folder of the .cpp of its stem,
or to the folder OWNERS names (headers with no .cpp of their name). An #include "..." from a file to a file of
another folder is an edge between the folders; to a header of another module, an edge between the modules.
--graph prints which folder includes which, with the files that do, and each folder's line count.
"""
import os
import re
import sys
from collections import defaultdict

# Public headers without a .cpp of the same stem: the folder whose code defines what they declare.
OWNERS = {
    "allocator.hpp": "sdk",
    "data.hpp": "sdk",  # the Stage interface, header-only
    "device.hpp": "sdk",  # backend_options.cpp and the device's checked entry points
    "error.hpp": "sdk",
    "layer.hpp": "sdk",
    "op_case.hpp": "sdk",
    "plugin.hpp": "sdk",  # registry.cpp
    "reference.hpp": "sdk",  # reference_op in op_table.cpp, each family's in core/ops
    "step.hpp": "sdk",
    "strategy.hpp": "sdk",
    "single_runner.hpp": "strategy",  # strategy_single.cpp
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    root = os.path.abspath(sys.argv[1])
    show = "--graph" in sys.argv[2:]
    core = os.path.join(root, "core")
    public_dir = os.path.join(core, "include", "kiln")

    folder_of = {}  # absolute path -> folder
    for d in [os.path.join(core, "ops")] + [
        os.path.join(core, "src", f) for f in sorted(os.listdir(os.path.join(core, "src")))
    ]:
        if not os.path.isdir(d):
            continue
        name = os.path.basename(d)
        for f in sorted(os.listdir(d)):
            if f.endswith((".cpp", ".hpp")):
                folder_of[os.path.join(d, f)] = name
    cpp_folder = {os.path.splitext(os.path.basename(p))[0]: f for p, f in folder_of.items() if p.endswith(".cpp")}

    errors = []
    for h in sorted(os.listdir(public_dir)):
        if not h.endswith(".hpp"):
            continue
        stem = h[:-4]
        owner = cpp_folder.get(stem) or OWNERS.get(h)
        if owner is None:
            errors.append(f"core/include/kiln/{h}: no core folder has {stem}.cpp; name its folder in OWNERS "
                          f"({os.path.relpath(__file__, root)})")
            continue
        folder_of[os.path.join(public_dir, h)] = owner

    def module(path):  # x_impl.hpp, a private header several x*.cpp share, is part of module x
        stem = os.path.splitext(os.path.basename(path))[0]
        return stem[: -len("_impl")] if stem.endswith("_impl") else stem

    folder_edges = defaultdict(set)  # (from, to) -> files
    module_edges = defaultdict(set)
    for path, folder in sorted(folder_of.items()):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for inc in INCLUDE.findall(text):
            if inc.startswith("kiln/"):
                target = os.path.join(core, "include", inc)
            else:
                target = os.path.normpath(os.path.join(os.path.dirname(path), inc))
            if target not in folder_of:
                continue  # not core's (a test helper, a vendor header)
            rel = os.path.relpath(path, root)
            if folder_of[target] != folder:
                folder_edges[(folder, folder_of[target])].add(rel)
            if module(target) != module(path):
                module_edges[(module(path), module(target))].add(rel)

    for kind, edges in (("folders", folder_edges), ("modules", module_edges)):
        for cycle in cycles(edges):
            hops = " -> ".join(cycle + [cycle[0]])
            via = "; ".join(
                f"{a} -> {b}: {', '.join(sorted(edges[(a, b)]))}" for a, b in zip(cycle, cycle[1:] + cycle[:1])
            )
            errors.append(f"include cycle between core's {kind}: {hops} ({via})")

    if show:
        lines = defaultdict(int)
        for path, folder in folder_of.items():
            if not path.startswith(public_dir):
                with open(path, encoding="utf-8") as f:
                    lines[folder] += sum(1 for _ in f)
        print("folder        lines  includes")
        for folder in sorted(lines):
            targets = sorted({b for (a, b) in folder_edges if a == folder})
            print(f"{folder:<12} {lines[folder]:>6}  {', '.join(targets) or '-'}")
    for e in errors:
        print("FAIL:", e)
    if errors:
        sys.exit(1)
    print("core's folders and modules include each other without a cycle")


def cycles(edges):
    """One cycle per strongly connected component of more than one node (Tarjan), each as a list of nodes."""
    graph = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph.setdefault(b, set())
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
                out.append(path_within(graph, set(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def path_within(graph, comp):
    """A cycle through the component's smallest node, by breadth-first search inside the component."""
    start = min(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & comp):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return sorted(comp)


if __name__ == "__main__":
    main()
