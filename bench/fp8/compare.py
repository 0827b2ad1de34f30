#!/usr/bin/env python3
"""fp8 against bf16 convergence (#36, acceptance 2), from the runs of bench/fp8/convergence.sh.

    python3 bench/fp8/compare.py OUT [--models gpt llama] [--base bf16] [--test fp8]

Reads OUT/<model>_<precision>/metrics.jsonl (the engine's log.dir: "train" records of each log
interval's mean loss and the run's cumulative skipped/non-finite step counts, "eval" records of
the validation loss). For each model it prints, base against test:
  - the final training loss (mean of the last 50 steps) and the final validation loss, and the
    relative gap (test - base) / base of each: PASS within --tol (1.5%);
  - skipped and non-finite steps, and non-finite logged losses: PASS when there are none;
  - whether the gap grows over the second half: the training losses smoothed over 50 steps, the
    relative gap's mean over the third quarter of the run against the fourth, and a straight
    line fitted to it over the second half (its change across the half, in the direction of
    the gap): PASS when neither grows by more than --trend-tol (0.5% of the loss);
  - that both runs logged the same steps, at least --min-steps (1000) of them.
Writes OUT/summary.json and exits 0 when every model passes, 1 otherwise. Standard library only.
"""
import argparse
import json
import math
import os
import sys


def load(path):
    """A run's metrics.jsonl -> ({step: train record}, {step: val_loss}). A resumed run appends to
    the same file, so a later line of a step replaces an earlier one."""
    train, val = {}, {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("kind") == "train":
                train[r["step"]] = r
            elif r.get("kind") == "eval":
                val[r["step"]] = float(r["val_loss"])  # float("NaN") reads the engine's "NaN"
    return train, val


def smoothed(train, window):
    """Step -> mean logged loss over (step - window, step]: each record is already the mean of
    its log interval's steps, so this is the mean over the last `window` steps."""
    steps = sorted(train)
    return {s: mean([float(train[t]["lm_loss"]) for t in steps if s - window < t <= s]) for s in steps}


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def slope(xs, ys):
    mx, my = mean(xs), mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def compare(base, test, a):
    (bt, bv), (tt, tv) = base, test
    out = {"checks": {}}
    last = max(bt) if bt else 0
    out["steps"] = {"base": last, "test": max(tt) if tt else 0}
    out["checks"]["steps"] = sorted(bt) == sorted(tt) and last >= a.min_steps

    # Health: the cumulative counters of the last record, and any non-finite logged loss.
    for name, (t, v) in (("base", base), ("test", test)):
        lastrec = t[max(t)] if t else {}
        out[name + "_health"] = {
            "skipped": int(lastrec.get("skipped_iterations", 0)),
            "nan": int(lastrec.get("nan_iterations", 0)),
            "non_finite_logged": sum(not finite(float(r["lm_loss"])) for r in t.values())
            + sum(not finite(x) for x in v.values()),
        }
    out["checks"]["healthy"] = all(sum(out[n + "_health"].values()) == 0 for n in ("base", "test"))

    # Final losses.
    def final_train(t):
        return mean([float(t[s]["lm_loss"]) for s in t if s > last - a.final_window])
    fb, ft = final_train(bt), final_train(tt)
    vb, vt = bv.get(last, float("nan")), tv.get(last, float("nan"))
    out["final_train"] = {"base": fb, "test": ft, "rel_gap": (ft - fb) / fb}
    out["final_val"] = {"base": vb, "test": vt, "rel_gap": (vt - vb) / vb}
    out["checks"]["final_train"] = abs(out["final_train"]["rel_gap"]) <= a.tol
    out["checks"]["final_val"] = abs(out["final_val"]["rel_gap"]) <= a.tol
    out["val_gaps"] = {s: (tv[s] - bv[s]) / bv[s] for s in sorted(bv) if s in tv}

    # Trend over the second half, on the relative gap of the smoothed training losses. Both runs
    # see the same batches, so most of the step-to-step noise cancels in the gap.
    sb, st = smoothed(bt, a.smooth), smoothed(tt, a.smooth)
    gap = {s: (st[s] - sb[s]) / sb[s] for s in sb if s in st}
    q3 = [gap[s] for s in gap if last / 2 < s <= 3 * last / 4]
    q4 = [gap[s] for s in gap if 3 * last / 4 < s]
    half = sorted(s for s in gap if s > last / 2)
    k = slope(half, [gap[s] for s in half]) if len(half) > 1 else float("nan")
    direction = 1.0 if mean(q3 + q4) >= 0 else -1.0  # growth = away from zero
    out["trend"] = {
        "gap_q3": mean(q3), "gap_q4": mean(q4),
        "abs_growth_q3_to_q4": abs(mean(q4)) - abs(mean(q3)),
        "slope_per_1000_steps": k * 1000,
        "fitted_growth_over_half": direction * k * (last / 2),
    }
    tr = out["trend"]
    out["checks"]["gap_not_growing"] = (finite(tr["abs_growth_q3_to_q4"]) and finite(tr["fitted_growth_over_half"])
                                        and tr["abs_growth_q3_to_q4"] <= a.trend_tol
                                        and tr["fitted_growth_over_half"] <= a.trend_tol)
    out["pass"] = all(out["checks"].values())
    return out


def json_safe(x):
    """NaN and the infinities as the engine writes them ("NaN", ...), so the file stays JSON."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    return x


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--models", nargs="+", default=["gpt", "llama"])
    p.add_argument("--base", default="bf16")
    p.add_argument("--test", default="fp8")
    p.add_argument("--tol", type=float, default=0.015, help="final losses: |relative gap| at most this")
    p.add_argument("--trend-tol", type=float, default=0.005, help="second half: the gap grows by at most this")
    p.add_argument("--min-steps", type=int, default=1000)
    p.add_argument("--final-window", type=int, default=50, help="steps averaged for the final training loss")
    p.add_argument("--smooth", type=int, default=50, help="steps of the moving average for the trend")
    a = p.parse_args()

    summary = {"criteria": {"tol": a.tol, "trend_tol": a.trend_tol, "min_steps": a.min_steps,
                            "base": a.base, "test": a.test}, "models": {}}
    for m in a.models:
        paths = [os.path.join(a.out, f"{m}_{prec}", "metrics.jsonl") for prec in (a.base, a.test)]
        missing = [q for q in paths if not os.path.exists(q)]
        if missing:
            print(f"{m}: FAIL: missing {', '.join(missing)}")
            summary["models"][m] = {"pass": False, "missing": missing}
            continue
        r = compare(load(paths[0]), load(paths[1]), a)
        summary["models"][m] = r
        ft, fv, tr = r["final_train"], r["final_val"], r["trend"]
        print(f"{m}: {r['steps']['base']} steps ({a.base}), {r['steps']['test']} ({a.test}); at least {a.min_steps} "
              "and the same logged steps needed")
        print(f"  final train loss (last {a.final_window} steps): {a.base} {ft['base']:.4f}  {a.test} {ft['test']:.4f}"
              f"  gap {100 * ft['rel_gap']:+.2f}%")
        print(f"  final validation loss:             {a.base} {fv['base']:.4f}  {a.test} {fv['test']:.4f}"
              f"  gap {100 * fv['rel_gap']:+.2f}%")
        print("  validation gap by step: " + " ".join(f"{s}:{100 * g:+.2f}%" for s, g in r["val_gaps"].items()))
        for n in ("base", "test"):
            h = r[n + "_health"]
            print(f"  {getattr(a, n)}: {h['skipped']} skipped, {h['nan']} non-finite steps, "
                  f"{h['non_finite_logged']} non-finite logged losses")
        print(f"  train gap ({a.smooth}-step mean), 3rd quarter {100 * tr['gap_q3']:+.2f}%, 4th {100 * tr['gap_q4']:+.2f}%;"
              f" slope {100 * tr['slope_per_1000_steps']:+.2f}% per 1000 steps")
        failed = [c for c, ok in r["checks"].items() if not ok]
        print(f"  {m}: {'PASS' if r['pass'] else 'FAIL (' + ', '.join(failed) + ')'}")
    ok = all(r["pass"] for r in summary["models"].values())
    summary["pass"] = ok
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(json_safe(summary), f, indent=1, allow_nan=False)
    print(f"fp8 convergence: {'PASS' if ok else 'FAIL'} (summary in {os.path.join(a.out, 'summary.json')})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
