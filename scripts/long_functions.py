#!/usr/bin/env python3
"""Lists functions longer than a limit in C++ sources, longest first; exits 1 if any is over it.

    python3 scripts/long_functions.py [--limit 80] [--top N] DIR...

A function is a '{' whose preceding code ends like a function header ("...)" with optional
const/override/noexcept/trailing return, or a constructor's initializer list); lambdas count
as functions of their own. Comments and string literals are blanked first. Its length is the
number of lines from the opening to the closing brace. CUDA kernels (*.cu) and the CLI's
main() are exempt (the project's rule: functions a reader can take in at once).
"""
import argparse
import os
import re
import sys

CONTROL = re.compile(r"\b(if|for|while|switch|catch|do|else|try|namespace|struct|class|enum|union|extern)\b")
HEADER_END = re.compile(r"\)\s*(const|override|noexcept|final|mutable|\s)*(->\s*[\w:<>,\s*&]+)?$")
INIT_LIST = re.compile(r"\)\s*:\s*[\w:]+[({]")
NAME = re.compile(r"([~\w:]+|\])\s*\([^()]*(\([^()]*\)[^()]*)*\)\s*[^()]*$")
EXEMPT = {("bindings/cli/main.cpp", "main")}


def blank(src):
    """Comments and string/char literals replaced by spaces, newlines kept."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i)
            j = n if j < 0 else j + 2
        elif src.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', src[i:])
            j = src.find(")" + m.group(1) + '"', i) + len(m.group(1)) + 2
        elif src[i] == '"' or (src[i] == "'" and not (i > 0 and src[i - 1].isalnum())):
            j = i + 1
            while j < n and src[j] != src[i]:
                j += 2 if src[j] == "\\" else 1
            j += 1
        else:
            out.append(src[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", src[i:j]))
        i = j
    return "".join(out)


def functions(path):
    """(lines, first line, name) of each function body in the file."""
    s = blank(open(path, encoding="utf-8", errors="replace").read())
    stack, last = [], 0
    for i, c in enumerate(s):
        if c == "{":
            head = s[last:i].strip()
            flat = head.replace("\n", " ")
            is_fn = bool(head.endswith(")") or HEADER_END.search(head) or INIT_LIST.search(head))
            name = ""
            if is_fn:
                m = NAME.search(flat)
                name = m.group(1) if m else flat[-40:]
                last_line = head.split("(")[0].split("\n")[-1]
                if CONTROL.search(last_line) or name in ("if", "for", "while", "switch", "catch", "return"):
                    is_fn = False
            stack.append((i, is_fn, name))
            last = i + 1
        elif c == "}":
            if stack:
                start, is_fn, name = stack.pop()
                if is_fn:
                    first = s.count("\n", 0, start) + 1
                    yield s.count("\n", start, i) + 1, first, name
            last = i + 1
        elif c == ";":
            last = i + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--top", type=int, default=10, help="also list this many of the longest")
    ap.add_argument("--root", default=".", help="paths are reported relative to this")
    a = ap.parse_args()
    found = []
    for d in a.dirs:
        for dirpath, _, files in os.walk(d):
            for f in sorted(files):
                if not f.endswith((".cpp", ".h", ".cc")):  # *.cu: CUDA kernels are exempt
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, a.root)
                for lines, first, name in functions(path):
                    if (rel, name) not in EXEMPT:
                        found.append((lines, rel, first, name))
    found.sort(key=lambda r: (-r[0], r[1], r[2]))
    print(f"longest functions (limit {a.limit} lines):")
    for lines, rel, first, name in found[: a.top]:
        print(f"  {lines:4d}  {rel}:{first}  {name}")
    over = [r for r in found if r[0] > a.limit]
    for lines, rel, first, name in over:
        print(f"too long: {rel}:{first} {name} has {lines} lines (limit {a.limit}): split it into named steps")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
