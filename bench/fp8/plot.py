#!/usr/bin/env python3
"""The fp8 convergence curves as a PNG: for each model a panel of loss against step (training
loss of each log interval, faint, and its 50-step mean; validation loss as markers), base and
test precision together (the y axis from the end of the first tenth of the run on), and beneath
it the relative gap of the 50-step means in percent, with the acceptance's +-1.5% dotted.

    python3 bench/fp8/plot.py OUT PNG [--models gpt llama] [--base bf16] [--test fp8]

OUT as bench/fp8/compare.py reads it. Needs matplotlib (Debian: apt-get install python3-matplotlib,
then run it with /usr/bin/python3).
"""
import argparse
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display: write the file only
import matplotlib.pyplot as plt  # noqa: E402

sys.dont_write_bytecode = True  # no __pycache__ left in the tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import load, smoothed  # noqa: E402  the same reading as the numbers


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("png")
    p.add_argument("--models", nargs="+", default=["gpt", "llama"])
    p.add_argument("--base", default="bf16")
    p.add_argument("--test", default="fp8")
    p.add_argument("--smooth", type=int, default=50)
    a = p.parse_args()

    fig, axes = plt.subplots(2, len(a.models), figsize=(6.5 * len(a.models), 6.5), sharex="col",
                             gridspec_kw={"height_ratios": [3, 1]}, squeeze=False)
    colors = {a.base: "tab:blue", a.test: "tab:red"}
    for col, m in enumerate(a.models):
        ax, gap_ax = axes[0][col], axes[1][col]
        runs, tail = {}, []
        for prec in (a.base, a.test):
            path = os.path.join(a.out, f"{m}_{prec}", "metrics.jsonl")
            if not os.path.exists(path):
                print(f"plot: {path} is missing; {m} {prec} left out", file=sys.stderr)
                continue
            train, val = load(path)
            runs[prec] = smoothed(train, a.smooth)
            steps = sorted(train)
            c = colors[prec]
            ax.plot(steps, [float(train[s]["lm_loss"]) for s in steps], color=c, alpha=0.25, lw=0.8)
            ax.plot(steps, [runs[prec][s] for s in steps], color=c, lw=1.6, label=f"{prec} train ({a.smooth}-step mean)")
            late = [s for s in steps if s >= steps[-1] / 10]
            tail += [runs[prec][s] for s in late] + [float(train[s]["lm_loss"]) for s in late]
            tail += [v for s, v in val.items() if s >= steps[-1] / 10]
            vs = sorted(val)
            ax.plot(vs, [val[s] for s in vs], "o--", color=c, ms=4, lw=0.8, label=f"{prec} validation")
        ok = [v for v in tail if math.isfinite(v)]
        if ok:  # the first tenth's fall from ~11 would flatten the part where the runs could part
            ax.set_ylim(min(ok) - 0.1, max(ok) + 0.2)
        ax.set_title(f"{m}: {a.test} against {a.base}")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if len(runs) == 2:
            b, t = runs[a.base], runs[a.test]
            steps = sorted(s for s in b if s in t)
            gaps = [100 * (t[s] - b[s]) / b[s] for s in steps]
            gap_ax.plot(steps, gaps, color="k", lw=1.2)
            ok = [g for g in gaps if math.isfinite(g)]
            gap_ax.set_ylim(min(ok + [-2.0]) - 0.2, max(ok + [2.0]) + 0.2)
        gap_ax.axhline(0, color="gray", lw=0.8)
        for bound in (-1.5, 1.5):  # the acceptance's tolerance on the final losses
            gap_ax.axhline(bound, color="gray", lw=0.8, ls=":")
        gap_ax.set_ylabel(f"train gap %\n({a.test} - {a.base}) / {a.base}")
        gap_ax.set_xlabel("step")
        gap_ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.png, dpi=120)
    print(f"plot: wrote {a.png}")


if __name__ == "__main__":
    main()
