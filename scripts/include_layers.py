#!/usr/bin/env python3
"""Checks that includes follow the layer order of docs/architecture.md; exits 1 if one does not.

    python3 scripts/include_layers.py [--root DIR]

docs/architecture.md names the folders from the lowest layer to the highest on one line:

    Layer order (lowest first): core, launch, doctor, ...

and the folders that stay out of LibTorch on another:

    Without LibTorch: launch, doctor, ...

A file of folder F may include the files of F and of any folder below it, never of a folder
above it. A file of a folder without LibTorch may not reach <torch/...>, <ATen/...> or <c10/...>,
directly or through the project headers it includes (Debian installs LibTorch's headers in
/usr/include, so the compiler alone would not notice). Prints every crossing include with the
file and line, then a summary.
"""
import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
TORCH = re.compile(r"^(torch|ATen|c10)/")
SOURCES = (".h", ".cpp", ".cu", ".cuh")


def folder_of(path):
    """engine/comm/x.h -> comm; bindings/lua/x.cpp -> bindings/lua; else None."""
    parts = path.split("/")
    if parts[0] == "engine" and len(parts) > 2:
        return parts[1]
    if parts[0] == "bindings" and len(parts) > 2:
        return "bindings/" + parts[1]
    return None


def read_order(root):
    text = open(os.path.join(root, "docs/architecture.md"), encoding="utf-8").read()
    order = re.search(r"^Layer order \(lowest first\):\s*(.+)$", text, re.M)
    torch_free = re.search(r"^Without LibTorch:\s*(.+)$", text, re.M)
    if not order or not torch_free:
        sys.exit("docs/architecture.md: no 'Layer order (lowest first): ...' or 'Without LibTorch: ...' line")
    split = lambda m: [w.strip(" .`") for w in m.group(1).split(",") if w.strip(" .`")]
    return split(order), set(split(torch_free))


def includes_of(root, path, cache):
    """[(line number, kind, target)] of a file, kind '<' or '"'."""
    if path not in cache:
        out = []
        try:
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if m:
                        out.append((n, m.group(1), m.group(2)))
        except FileNotFoundError:
            pass
        cache[path] = out
    return cache[path]


def reaches_torch(root, path, cache, seen):
    """The chain of project headers from `path` to a LibTorch header, or None."""
    if path in seen:
        return None
    seen.add(path)
    for _, kind, target in includes_of(root, path, cache):
        if kind == "<" and TORCH.match(target):
            return [path, "<" + target + ">"]
        if kind == '"' and (target.startswith("engine/") or target.startswith("bindings/")):
            chain = reaches_torch(root, target, cache, seen)
            if chain:
                return [path] + chain
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    root = os.path.abspath(ap.parse_args().root)
    order, torch_free = read_order(root)
    rank = {name: i for i, name in enumerate(order)}
    cache, problems, crossings, files = {}, [], 0, 0
    for top in ("engine", "bindings"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                here = folder_of(path)
                if here is None:
                    continue
                files += 1
                if here not in rank:
                    problems.append(f"{path}: folder '{here}' is not in docs/architecture.md's layer order")
                    continue
                for n, kind, target in includes_of(root, path, cache):
                    there = folder_of(target) if kind == '"' else None
                    if there is None or there == here:
                        continue
                    crossings += 1
                    if there not in rank:
                        problems.append(f"{path}:{n}: includes {target}, of a folder not in the layer order")
                    elif rank[there] > rank[here]:
                        problems.append(f"{path}:{n}: includes {target}: {there}/ is above {here}/ in the layer order")
                if here in torch_free:
                    chain = reaches_torch(root, path, cache, set())
                    if chain:
                        problems.append(f"{path}: {here}/ is without LibTorch, but reaches it: " + " -> ".join(chain))
    for p in problems:
        print(p)
    print(f"{files} files, {crossings} includes across folders, {len(problems)} against the layer order")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
