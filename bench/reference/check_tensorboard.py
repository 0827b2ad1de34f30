#!/usr/bin/env python3
"""Reads a run's TensorBoard event files with TensorBoard's own EventAccumulator and checks
every scalar against the run's other records of the same numbers.

  python3 bench/reference/check_tensorboard.py LOG_DIR [--progress train.out] [--no-jsonl]

LOG_DIR is the run's log.dir: LOG_DIR/tensorboard/events.out.tfevents.* and LOG_DIR/metrics.jsonl.
- Against metrics.jsonl (unless --no-jsonl): every value of every line must be in TensorBoard at
  the line's step, under the key's tag, equal to the JSON value rounded to float32 (the event
  file's simple_value is a float); NaN/Infinity (written as the strings "NaN", "Infinity") must
  be NaN/Inf there; and TensorBoard must hold no scalar that metrics.jsonl lacks.
- Against progress lines (--progress FILE, the trainer's stdout, "[rank 0]" prefixes and all):
  each field of each " iteration N/M | ..." and " validation loss at iteration N | ..." line that
  has a tag below must equal TensorBoard's value at step N within the precision printed
  (half a unit of the last printed digit, plus float32 rounding).
- The resolved recipe must be a text summary (plugin "text") at step 0, a scalar string.
Exit status 0 when everything matches, 1 on any mismatch (each one printed), 2 on bad usage.
Needs the `tensorboard` package (not numpy beyond what it brings along).
"""

import argparse
import decimal
import json
import math
import os
import re
import struct
import sys

# JSON key -> TensorBoard tag: the table of engine/metrics/metrics_record.cpp (known_metrics()).
TAGS = {
    "lm_loss": "lm loss",
    "learning_rate": "learning-rate",
    "grad_norm": "grad-norm",
    "loss_scale": "loss-scale",
    "skipped_iterations": "skipped-iterations",
    "nan_iterations": "nan-iterations",
    "iteration_time_s": "iteration-time",
    "tokens_per_s": "tokens-per-sec",
    "tflops_per_gpu": "throughput",
    "mfu": "mfu",
    "peak_memory_bytes": "mem-max-allocated-bytes",
    "consumed_samples": "consumed-samples",
    "batch_size": "batch-size",
    "val_loss": "lm loss validation",
    "val_ppl": "lm loss validation ppl",
}

# Progress-line field -> (tag, factor from the printed number to the logged value).
TRAIN_FIELDS = {
    "consumed samples": ("consumed-samples", 1.0),
    "elapsed time per iteration (ms)": ("iteration-time", 1e-3),
    "learning rate": ("learning-rate", 1.0),
    "global batch size": ("batch-size", 1.0),
    "lm loss": ("lm loss", 1.0),
    "grad norm": ("grad-norm", 1.0),
    "number of skipped iterations": ("skipped-iterations", 1.0),
    "number of nan iterations": ("nan-iterations", 1.0),
    "tokens/s": ("tokens-per-sec", 1.0),
    "TFLOP/s/GPU": ("throughput", 1.0),
    "MFU": ("mfu", 1e-2),  # printed as a percentage
    "loss scale": ("loss-scale", 1.0),
}
EVAL_FIELDS = {
    "lm loss": ("lm loss validation", 1.0),
    "lm loss PPL": ("lm loss validation ppl", 1.0),
}

TRAIN_LINE = re.compile(r"\biteration\s+(\d+)/\s*\d+\s*\|(.*)$")
EVAL_LINE = re.compile(r"\bvalidation loss at iteration (\d+)\s*\|(.*)$")


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def json_value(v):
    if isinstance(v, str):
        return float(v)  # "NaN", "Infinity", "-Infinity"
    return float(v)


def same(tb, want):
    if math.isnan(want):
        return math.isnan(tb)
    return tb == f32(want)


def load_scalars(log_dir):
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(os.path.join(log_dir, "tensorboard"), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    scalars = {}  # (tag, step) -> value
    for tag in acc.Tags()["scalars"]:
        for ev in acc.Scalars(tag):
            if (tag, ev.step) in scalars:
                raise SystemExit(f"TensorBoard has two values of '{tag}' at step {ev.step} (two runs in one log.dir?)")
            scalars[(tag, ev.step)] = ev.value
    return acc, scalars


def check_recipe(acc, problems):
    from tensorboard.util import tensor_util

    if "recipe" not in acc.Tags()["tensors"]:
        problems.append("no text summary 'recipe' in the event file")
        return
    meta = acc.SummaryMetadata("recipe")
    if meta.plugin_data.plugin_name != "text":
        problems.append(f"'recipe' is for plugin '{meta.plugin_data.plugin_name}', not 'text'")
    events = acc.Tensors("recipe")
    arr = tensor_util.make_ndarray(events[0].tensor_proto)
    if events[0].step != 0 or arr.shape != ():
        problems.append(f"'recipe' at step {events[0].step} with shape {arr.shape}; expected step 0, a scalar")
    text = arr.item().decode("utf-8")
    print(f"recipe: text summary at step {events[0].step}, {len(text)} characters, first line: {text.splitlines()[0]!r}")


def check_jsonl(path, scalars, problems):
    seen = set()
    lines = 0
    with open(path) as f:
        for n, line in enumerate(f, 1):
            rec = json.loads(line)
            lines += 1
            for key, raw in rec.items():
                if key in ("kind", "step", "wall_time"):
                    continue
                tag = TAGS.get(key, key)
                want = json_value(raw)
                got = scalars.get((tag, rec["step"]))
                seen.add((tag, rec["step"]))
                if got is None:
                    problems.append(f"metrics.jsonl line {n}: {key} = {raw} at step {rec['step']}: not in TensorBoard ('{tag}')")
                elif not same(got, want):
                    problems.append(f"metrics.jsonl line {n}: {key} = {raw!r} but TensorBoard '{tag}' at step {rec['step']} = {got!r}")
    for tag, step in sorted(set(scalars) - seen, key=lambda x: (x[1], x[0])):
        problems.append(f"TensorBoard '{tag}' at step {step} = {scalars[(tag, step)]} is not in metrics.jsonl")
    print(f"metrics.jsonl: {lines} lines, {len(seen)} values compared with TensorBoard")
    return len(seen)


def printed_tolerance(text, value):
    """Half a unit of the last digit printed, plus float32 rounding of the logged value."""
    d = decimal.Decimal(text)
    return 0.5 * 10.0 ** d.as_tuple().exponent + abs(value) * 2.0**-23


def parse_fields(rest):
    fields = {}
    for part in rest.split("|"):
        if ":" not in part:
            continue
        name, _, value = part.rpartition(":")
        value = value.strip().rstrip("%")
        try:
            float(value)
        except ValueError:
            continue  # a field that is not a number (an ETA, say)
        fields[name.strip()] = value
    return fields


def check_progress(path, scalars, problems):
    compared = 0
    lines = 0
    with open(path, errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = EVAL_LINE.search(line)
            table = EVAL_FIELDS
            if not m:
                m = TRAIN_LINE.search(line)
                table = TRAIN_FIELDS
            if not m:
                continue
            lines += 1
            step = int(m.group(1))
            for name, text in parse_fields(m.group(2)).items():
                if name not in table:
                    continue
                tag, factor = table[name]
                got = scalars.get((tag, step))
                if got is None:
                    problems.append(f"{path}:{n}: '{name}: {text}' at iteration {step}: no TensorBoard '{tag}' there")
                    continue
                printed = float(text)
                compared += 1
                if math.isnan(printed) or math.isinf(printed):
                    ok = (math.isnan(printed) and math.isnan(got)) or printed == got
                else:
                    want = printed * factor
                    ok = abs(got - want) <= printed_tolerance(text, printed) * factor
                if not ok:
                    problems.append(f"{path}:{n}: '{name}: {text}' but TensorBoard '{tag}' at step {step} = {got!r}")
    print(f"{path}: {lines} progress lines, {compared} printed values compared with TensorBoard")
    return compared


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log_dir")
    p.add_argument("--progress", help="the run's stdout, with its progress lines")
    p.add_argument("--no-jsonl", action="store_true", help="do not compare with LOG_DIR/metrics.jsonl")
    a = p.parse_args()
    if not os.path.isdir(os.path.join(a.log_dir, "tensorboard")):
        print(f"{a.log_dir}/tensorboard is not a directory: give the run's log.dir", file=sys.stderr)
        return 2
    acc, scalars = load_scalars(a.log_dir)
    print(f"TensorBoard: {len(scalars)} scalars under {len({t for t, _ in scalars})} tags in {a.log_dir}/tensorboard")
    problems = []
    check_recipe(acc, problems)
    compared = 0
    if not a.no_jsonl:
        compared += check_jsonl(os.path.join(a.log_dir, "metrics.jsonl"), scalars, problems)
    if a.progress:
        compared += check_progress(a.progress, scalars, problems)
    if not scalars or compared == 0:
        problems.append("nothing was compared")
    for line in problems:
        print("MISMATCH " + line)
    print(f"check_tensorboard: {'FAILED, ' + str(len(problems)) + ' problems' if problems else 'every scalar matches'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
