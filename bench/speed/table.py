#!/usr/bin/env python3
"""Markdown table of speed-benchmark rows (JSON lines), standard library only.

Input rows, one JSON object a line (blank lines and lines starting with # are skipped):
  result rows: engine ("megaengine" | "pytorch-eager" | "pytorch-compile"), model, layout,
               micro, accum, seq, steps, tokens_per_s, ms_per_step, tflops_per_gpu, mfu
               (fraction or null), peak_mem_mib, params, final_loss; optional "error".
  peak row:    {"what": "matmul_peak", "tflops": X, "device": name} (the best one is used).

Prints the table, then one comparison line per model and layout:
  megaengine / faster PyTorch reference: X.XXx tokens/s (eager A, compile B)
A data-parallel layout with options ("4 GPUs distopt") is compared with the references of its
plain layout ("4 GPUs", PyTorch's DistributedDataParallel) when none has its exact layout.

  python3 bench/speed/table.py results.jsonl [more.jsonl ...]
  python3 bench/speed/table.py --peak results.jsonl   # the last peak row's TFLOP/s, for scripts
"""

import json
import sys

ENGINE_ORDER = {"megaengine": 0, "pytorch-compile": 1, "pytorch-eager": 2}


def load(paths):
    rows, peaks = [], []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    print(f"warning: {path}:{lineno}: not JSON ({e}), skipped", file=sys.stderr)
                    continue
                if row.get("what") == "matmul_peak":
                    peaks.append(row)
                elif "engine" in row:
                    rows.append(row)
                else:
                    print(f"warning: {path}:{lineno}: neither a result nor a peak row, skipped", file=sys.stderr)
    return rows, peaks


def num(row, key):
    v = row.get(key)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def fmt(v, spec, missing="–"):
    return missing if v is None else format(v, spec)


def mfu_percent(row, peak):
    m = num(row, "mfu")
    if m is not None and m > 0:
        return 100.0 * m
    t = num(row, "tflops_per_gpu")
    if t is not None and peak:
        return 100.0 * t / peak
    return None


def batch(row):
    return f"{row.get('micro', '?')} x {row.get('accum', 1)}"


def table(rows, peak):
    models = []
    for r in rows:
        if r.get("model") not in models:
            models.append(r.get("model"))
    key = lambda r: (models.index(r.get("model")), str(r.get("layout", "")),  # noqa: E731
                     ENGINE_ORDER.get(r.get("engine"), 9), str(r.get("engine")),
                     num(r, "micro") or 0, num(r, "accum") or 0)
    out = ["| Configuration | Engine | Layout | Micro x accum | Tokens/s | ms/step | TFLOP/s/GPU | MFU % | Peak mem MiB |",
           "|---|---|---|---|--:|--:|--:|--:|--:|"]
    for r in sorted(rows, key=key):
        head = f"| {r.get('model', '?')} | {r.get('engine', '?')} | {r.get('layout', '?')} | {batch(r)} |"
        if r.get("error"):
            out.append(f"{head} error: {r['error']} | – | – | – | – |")
            continue
        out.append(f"{head} {fmt(num(r, 'tokens_per_s'), ',.0f')} | {fmt(num(r, 'ms_per_step'), '.1f')} | "
                   f"{fmt(num(r, 'tflops_per_gpu'), '.1f')} | {fmt(mfu_percent(r, peak), '.1f')} | "
                   f"{fmt(num(r, 'peak_mem_mib'), ',.0f')} |")
    return out, models


def best(rows):
    """The row with the most tokens/s among rows without an error (None if none)."""
    ok = [r for r in rows if not r.get("error") and num(r, "tokens_per_s")]
    return max(ok, key=lambda r: r["tokens_per_s"]) if ok else None


def plain_data_parallel(layout):
    """'4 GPUs distopt' -> '4 GPUs'; None for layouts that split the model (tp=, pp=) or are plain."""
    words = str(layout).split()
    if len(words) > 2 and words[1] == "GPUs" and not any("=" in w for w in words[2:]):
        return " ".join(words[:2])
    return None


def comparisons(rows, models):
    out = []
    for model in models:
        layouts = []
        for r in rows:
            if r.get("model") == model and r.get("layout") not in layouts:
                layouts.append(r.get("layout"))
        for layout in layouts:
            group = [r for r in rows if r.get("model") == model and r.get("layout") == layout]
            me = best([r for r in group if r.get("engine") == "megaengine"])
            refs_of = lambda lay, eng: best([r for r in rows if r.get("model") == model  # noqa: E731
                                             and r.get("layout") == lay and r.get("engine") == eng])
            eager, comp = refs_of(layout, "pytorch-eager"), refs_of(layout, "pytorch-compile")
            tag = f"{model}, {layout}"
            base = plain_data_parallel(layout)
            if eager is None and comp is None and base:
                eager, comp = refs_of(base, "pytorch-eager"), refs_of(base, "pytorch-compile")
                if eager or comp:
                    tag += f" (against the references on {base})"
            refs = [r for r in (eager, comp) if r is not None]
            tps = lambda r: "n/a" if r is None else f"{r['tokens_per_s']:,.0f}"  # noqa: E731
            if me is None and not refs:
                out.append(f"- {tag}: no successful run")
            elif me is None:
                out.append(f"- {tag}: megaengine / faster PyTorch reference: n/a (no successful megaengine run; "
                           f"eager {tps(eager)}, compile {tps(comp)})")
            elif not refs:
                out.append(f"- {tag}: megaengine / faster PyTorch reference: n/a (megaengine {tps(me)}; "
                           f"no successful PyTorch reference run for this layout)")
            else:
                ref = max(refs, key=lambda r: r["tokens_per_s"])
                out.append(f"- {tag}: megaengine / faster PyTorch reference: "
                           f"{me['tokens_per_s'] / ref['tokens_per_s']:.2f}x tokens/s "
                           f"(eager {tps(eager)}, compile {tps(comp)}; megaengine {tps(me)} "
                           f"at micro {batch(me)}; best run of each engine)")
    return out


def main(argv=None):
    paths = sys.argv[1:] if argv is None else argv
    if not paths or paths[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if paths else 2
    if paths[0] == "--peak":  # the peak measured last (this call's), as a bare number
        _, peaks = load(paths[1:])
        if not peaks:
            print("no matmul_peak row in " + " ".join(paths[1:]), file=sys.stderr)
            return 1
        print(peaks[-1]["tflops"])
        return 0
    rows, peaks = load(paths)
    peak_row = max(peaks, key=lambda r: r.get("tflops") or 0) if peaks else None
    peak = num(peak_row, "tflops") if peak_row else None
    lines, models = table(rows, peak)
    if peak_row:
        print(f"Measured bf16 matmul peak: {peak:.1f} TFLOP/s ({peak_row.get('device', '?')}); "
              f"MFU % is TFLOP/s/GPU over it where a row carries no mfu.\n")
    else:
        print("No matmul_peak row: MFU % only where a row carries mfu.\n")
    print("\n".join(lines))
    print()
    print("\n".join(comparisons(rows, models)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
