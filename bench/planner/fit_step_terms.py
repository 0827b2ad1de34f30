#!/usr/bin/env python3
"""The planner's whole-step terms fitted from bench/speed/tp_width.sh's table: what isolated
kernel timings (megaengine plan --calibrate) cannot show.

  compute_in_step    by hidden size: measured / modelled compute (GEMMs, attention, other kernels
                     at the profile's isolated rates) on one GPU: the tp 1 layers of the table
                     (hidden 8192) and, with --one-gpu, whole 1-GPU steps of
                     bench/speed/multi_gpu_table.sh's rows.jsonl (GPT 1.3B, LLaMA 1B: 2048), the
                     mean over the models of each width;
  tp_exposed         per tp: (measured layer time - compute_in_step x compute) / the layer's
  tp_exposed_no_sp   standalone TP collectives, with sequence parallelism and without.

The model's terms come from dry runs (marginal: 2 layers - 1 layer, micro 1, global 8, as
tp_width.sh runs them) with a copy of PROFILE whose exposures are 1 and compute_in_step 1.
  python3 bench/planner/fit_step_terms.py BUILD/megaengine TABLE.md PROFILE.json [--one-gpu ROWS.jsonl] [--write OUT.json]
"""
import argparse, datetime, json, os, re, subprocess, sys, tempfile

WIDTHS = {"gpt39b-2l": "gpt39b-width", "llama70b-2l": "llama70b-width"}  # tp_width.sh -> recorded.lua
HIDDEN = {"gpt39b-width": 8192, "llama70b-width": 8192, "gpt1.3b": 2048, "llama1b": 2048}
ONE_GPU = ("gpt1.3b", "llama1b")  # multi_gpu.sh's names, recorded.lua's too
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measured_rows(table):
    rows = {}
    for line in open(table):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] not in WIDTHS:
            continue
        m = re.fullmatch(r"tp (\d+)(?: \+ (SP|no SP))?", cells[1])
        if not m:
            continue
        tp, sp = int(m.group(1)), m.group(2) == "SP"
        rows[(WIDTHS[cells[0]], tp, sp and tp > 1)] = float(cells[2])
    return rows


def model_terms(binary, profile_path, model, layers, tp, sp, micro=1, batch=8):
    depth = [f"model.layers={layers}"] if layers else []
    out = subprocess.run([binary, "--dry-run", os.path.join(REPO, "bench/planner/recorded.lua"), "--world", str(tp),
                          "--profile", profile_path, f"batch.micro={micro}", f"batch.global={batch}", *depth,
                          f"parallel.tp={tp}", f"parallel.sequence_parallel={'true' if sp else 'false'}"],
                         env=dict(os.environ, ME_PLAN_MODEL=model), capture_output=True, text=True)
    line = next((l for l in out.stdout.splitlines() if l.strip().endswith("(ms)")), None)
    if line is None:
        sys.exit(f"fit_step_terms: the dry run of {model} at tp {tp} printed no terms:\n{out.stdout}{out.stderr}")
    return {k.strip(): float(v) for k, v in re.findall(r"([A-Za-z][A-Za-z \-]*?) ([0-9.]+)", line.replace("(ms)", ""))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary"), ap.add_argument("table"), ap.add_argument("profile")
    ap.add_argument("--one-gpu", help="bench/speed/multi_gpu_table.sh's rows.jsonl: its 1-GPU rows fit the 2048-wide point")
    ap.add_argument("--write", help="the profile with the fitted terms")
    a = ap.parse_args()
    rows = measured_rows(a.table)
    if not any(tp == 1 for (_, tp, _) in rows):
        sys.exit(f"fit_step_terms: {a.table} has no tp 1 rows of {', '.join(WIDTHS)} (bench/speed/tp_width.sh's table.md)")
    profile = json.load(open(a.profile))
    unit = dict(profile, compute_in_step=1.0)
    one_gpu = []
    if a.one_gpu:
        one_gpu = [r for r in map(json.loads, open(a.one_gpu)) if r.get("layout") == "1 GPU" and r.get("model") in ONE_GPU
                   and r.get("engine", "megaengine") == "megaengine"]
    tps = sorted({tp for (_, tp, _) in rows if tp > 1})
    unit["tp_exposed"] = {str(t): 1.0 for t in tps}
    unit["tp_exposed_no_sp"] = {str(t): 1.0 for t in tps}
    for key in ("host_layer_ms", "host_layer_ms_no_sp"):
        unit.pop(key, None)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(unit, f)
    try:
        marginal = {}
        for (model, tp, sp) in rows:
            one, two = (model_terms(a.binary, f.name, model, n, tp, sp) for n in (1, 2))
            d = {k: two.get(k, 0) - one.get(k, 0) for k in set(one) | set(two)}
            marginal[(model, tp, sp)] = (d.get("GEMMs", 0) + d.get("attention", 0) + d.get("other kernels", 0),
                                         d.get("TP comm exposed", 0))
        ratios = {}  # hidden -> [measured / modelled compute]
        for r in rows:
            if r[1] == 1:
                ratios.setdefault(HIDDEN[r[0]], []).append(rows[r] / marginal[r][0])
        for r in one_gpu:  # whole steps: less the optimizer, which the factor does not cover
            t = model_terms(a.binary, f.name, r["model"], 0, 1, False, r["micro"], r["micro"] * r.get("accum", 1))
            compute = t.get("GEMMs", 0) + t.get("attention", 0) + t.get("other kernels", 0)
            ratios.setdefault(HIDDEN[r["model"]], []).append((r["ms_per_step"] - t.get("optimizer", 0)) / compute)
    finally:
        os.unlink(f.name)
    curve = [[h, sum(v) / len(v)] for h, v in sorted(ratios.items())]
    for h, v in sorted(ratios.items()):
        print(f"compute_in_step at hidden {h}: {sum(v) / len(v):.3f} ({', '.join(f'{x:.3f}' for x in v)})")
    k = {h: v for h, v in curve}  # each row's compute at its own width
    fitted = {"tp_exposed": {}, "tp_exposed_no_sp": {}}
    for tp in tps:
        for sp in (True, False):
            pts = [(rows[r] - k[HIDDEN[r[0]]] * marginal[r][0]) / marginal[r][1] for r in rows if r[1] == tp and r[2] == sp and marginal[r][1] > 0]
            if pts:
                value = max(0.0, sum(pts) / len(pts))
                fitted["tp_exposed" if sp else "tp_exposed_no_sp"][str(tp)] = round(value, 3)
                print(f"tp {tp}{' + SP' if sp else ', no SP'}: exposure {value:.2f} (by width: {', '.join(f'{x:.2f}' for x in pts)})")
    if a.write:
        out = dict(profile, compute_in_step=[[h, round(v, 3)] for h, v in curve], **{n: v for n, v in fitted.items() if v})
        out["source"] += (f"; compute_in_step, tp_exposed, tp_exposed_no_sp fitted by bench/planner/fit_step_terms.py"
                          f" from {os.path.basename(a.table)}"
                          + (f" and {os.path.basename(a.one_gpu)}" if a.one_gpu else "") + f", {datetime.date.today()}")
        with open(a.write + ".tmp", "w") as g:
            json.dump(out, g, indent=2)
            g.write("\n")
        os.replace(a.write + ".tmp", a.write)
        print(f"fit_step_terms: wrote {a.write}")


if __name__ == "__main__":
    main()
