#!/usr/bin/env python3
"""readme_check.py MEGAENGINE [REPO]: the README stays short, its commands work, and every link in
README.md and docs/*.md resolves (CTest docs.readme).

Commands are the lines of the README's fenced blocks whose info string starts with `sh`
(a trailing backslash continues a line, `#` starts a comment):
- ```sh blocks are meant for this machine: a `megaengine` command runs with the built binary, a
  training run as `--dry-run` (the same recipe, layout and memory checks, no data read);
  `bash FILE` must name a script that parses (`bash -n`); they install packages, build, or need
  GPUs, so they are not run here.
- ```sh cluster / ```sh gpu blocks are for a Slurm cluster or a GPU machine: the scripts and recipes
  they name must exist and parse, and their `megaengine --dry-run` commands run.
In every block each path into the repository (recipes/..., slurm/..., bench/...) must exist.
"""
import os
import re
import shlex
import subprocess
import sys

MAX_README_LINES = 160
REPO_DIRS = ("recipes/", "slurm/", "container/", "bench/", "scripts/", "docs/", "tests/", "engine/", "bindings/")
TRAINING_FREE = {"--dry-run", "--fields", "-e", "--help", "--version", "doctor", "preprocess", "checkpoint", "export"}


def fenced_blocks(text):
    """(info string, [lines]) of every fenced block."""
    blocks, info, lines = [], None, []
    for line in text.splitlines():
        if line.startswith("```"):
            if info is None:
                info, lines = line[3:].strip(), []
            else:
                blocks.append((info, lines))
                info = None
        elif info is not None:
            lines.append(line)
    return blocks


def commands(lines):
    """Logical command lines: continuations joined, comments and blanks dropped."""
    out, cur = [], ""
    for line in lines:
        cur += line.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        words = shlex.split(cur, comments=True)
        if words:
            out.append((cur.strip(), words))
        cur = ""
    return out


def split_command(words):
    """Leading VAR=value words -> env, and the rest; `&&` and `;` split several commands."""
    parts, cur = [], []
    for w in words:
        if w in ("&&", ";", "||"):
            parts.append(cur)
            cur = []
        else:
            cur.append(w)
    parts.append(cur)
    for part in parts:
        env = {}
        while part and re.match(r"^[A-Z_][A-Z0-9_]*=", part[0]):
            k, v = part.pop(0).split("=", 1)
            env[k] = v
        if part:
            yield env, part


def check_paths(repo, words, problems, where):
    for w in words:
        w = w.split("=", 1)[-1].rstrip(".,:;")
        if w.startswith(REPO_DIRS) and "<" not in w and "$" not in w and not os.path.exists(os.path.join(repo, w)):
            problems.append(f"{where}: names {w}, which does not exist")


def run_megaengine(binary, repo, env, args, problems, where):
    if not any(a in TRAINING_FREE for a in args):
        args = ["--dry-run"] + args
    full_env = dict(os.environ, **env)
    full_env.setdefault("ME_ASSET_DIR", os.path.join(repo, "assets"))
    try:
        p = subprocess.run([binary] + args, cwd=repo, env=full_env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        problems.append(f"{where}: megaengine {' '.join(args)} ran past 240 s")
        return
    if p.returncode != 0:
        tail = "\n    ".join((p.stdout + p.stderr).strip().splitlines()[-6:])
        problems.append(f"{where}: megaengine {' '.join(args)} exited {p.returncode}:\n    {tail}")
    else:
        print(f"ok   megaengine {' '.join(args)}")


def check_script(repo, path, problems, where):
    full = os.path.join(repo, path)
    if not os.path.isfile(full):
        problems.append(f"{where}: no script {path}")
    elif subprocess.run(["bash", "-n", full]).returncode != 0:
        problems.append(f"{where}: {path} does not parse (bash -n)")
    else:
        print(f"ok   {path} exists and parses (not run here)")


def check_command(binary, repo, local, env, words, problems, where):
    prog = words[0]
    if prog == "megaengine":
        if local or "--dry-run" in words or "--fields" in words:
            run_megaengine(binary, repo, env, words[1:], problems, where)
    elif prog == "bash" and len(words) > 1:
        check_script(repo, words[1], problems, where)
    elif prog == "sbatch":
        script = next((w for w in words[1:] if not w.startswith("-")), None)
        if script is None:
            problems.append(f"{where}: sbatch without a script")
        else:
            check_script(repo, script, problems, where)
    elif prog.startswith(REPO_DIRS):
        check_script(repo, prog, problems, where)


def check_readme(binary, repo, problems):
    path = os.path.join(repo, "README.md")
    text = open(path, encoding="utf-8").read()
    n = len(text.splitlines())
    if n > MAX_README_LINES:
        problems.append(f"README.md has {n} lines; keep it at most {MAX_README_LINES} (move reference material to docs/)")
    ran = 0
    for info, lines in fenced_blocks(text):
        if not info.startswith("sh"):
            continue
        local = info == "sh"
        for line, words in commands(lines):
            where = f"README.md `{line[:70]}`"
            check_paths(repo, words, problems, where)
            for env, part in split_command(words):
                check_command(binary, repo, local, env, part, problems, where)
                ran += 1
    if ran < 5:
        problems.append(f"README.md: only {ran} commands found in ```sh blocks")


def slug(heading):
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    text = open(path, encoding="utf-8").read()
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def check_links(repo, problems):
    pages = [os.path.join(repo, "README.md")]
    docs = os.path.join(repo, "docs")
    pages += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    count = 0
    for page in pages:
        text = open(page, encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)  # code is not links
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, frag = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(page), file)) if file else page
            rel = os.path.relpath(page, repo)
            count += 1
            if not os.path.exists(full):
                problems.append(f"{rel}: link {target} does not resolve")
            elif frag and full.endswith(".md") and frag not in anchors(full):
                problems.append(f"{rel}: link {target}: no heading #{frag} in {os.path.relpath(full, repo)}")
    print(f"ok   {count} links in {len(pages)} pages checked")


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: readme_check.py MEGAENGINE [REPO]")
    binary = os.path.abspath(sys.argv[1])
    repo = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "../.."))
    problems = []
    check_readme(binary, repo, problems)
    check_links(repo, problems)
    if problems:
        print("FAILED:\n" + "\n".join("  " + p for p in problems))
        sys.exit(1)
    print("readme_check: README commands and every link in README.md and docs/ check out")


if __name__ == "__main__":
    main()
