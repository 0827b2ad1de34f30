#!/usr/bin/env python3
"""Megatron's sample order against megaengine's: builds the same splits with Megatron-core's own
GPTDataset / BlendedDataset (through BlendedMegatronDatasetBuilder) and with megaengine's
me.data.loader, and compares the tokens and labels of every sample.

    python3 bench/reference/megatron_order.py --megatron DIR --megaengine BIN --work /tmp/mo

DIR holds Megatron-LM's `megatron/core` (github.com/NVIDIA/Megatron-LM); BIN is a built
megaengine. Needs python3 with numpy and torch, a C++ compiler, Python's headers and pybind11's
(the pybind11 module, torch's wheel under torch/include, or /usr/include). No network.

The data: assets/moby-dick.txt preprocessed by `megaengine preprocess` with the GPT-2 tokenizer
(dataset A: every paragraph; dataset B: every other paragraph, in reverse order). The cases:
a single dataset with split 100,0,0 and 98,2,0 (train and valid) at seq 64 and 128, with sample
counts giving one epoch, two epochs with a separate final epoch, and several epochs shuffled as
one; a blend of A and B weighted 0.3/0.7; and A alone given with a weight (a blend of one).

Megatron's dataset modules run unchanged. Its package __init__ files (megatron, megatron.core)
are not run, because they import the whole framework (models, checkpointing, ...); in their
place this script provides: megatron.core.utils.log_single_rank (Megatron's own, from
megatron/core/_rank_utils.py), megatron.core.safe_globals.safe_numpy_load (numpy.load) and
megatron.core.tokenizers.MegatronTokenizerBase (a type annotation). None of them touches the
order. helpers.cpp is compiled here, from DIR, into --work.

Prints one line per case and exits 0 only if every sample of every case is identical.
"""
import argparse
import importlib.util
import logging
import os
import subprocess
import sys
import sysconfig
import types

import numpy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- Megatron-core, imported without its framework ----

def compile_helpers(megatron_dir, work):
    """helpers.cpp -> work/helpers_cpp<ext>, as Megatron's datasets/Makefile builds it."""
    src = os.path.join(megatron_dir, "megatron", "core", "datasets", "helpers.cpp")
    out = os.path.join(work, "helpers_cpp" + sysconfig.get_config_var("EXT_SUFFIX"))
    includes = [sysconfig.get_paths()["include"]]
    try:
        import pybind11
        includes.append(pybind11.get_include())
    except ImportError:
        import torch
        includes += [os.path.join(os.path.dirname(torch.__file__), "include"), "/usr/include"]
    if not any(os.path.isfile(os.path.join(d, "pybind11", "pybind11.h")) for d in includes):
        sys.exit("megatron_order: no pybind11 headers (pip install pybind11, or Debian's pybind11-dev)")
    if not os.path.isfile(os.path.join(includes[0], "Python.h")):
        sys.exit(f"megatron_order: no Python.h under {includes[0]} (Debian: python3-dev)")
    cmd = [os.environ.get("CXX", "c++"), "-O3", "-Wall", "-shared", "-std=c++17", "-fPIC",
           *[f"-I{d}" for d in includes], src, "-o", out]
    subprocess.run(cmd, check=True)
    return out


def import_megatron(megatron_dir, helpers_path):
    core = os.path.join(megatron_dir, "megatron", "core")
    if not os.path.isfile(os.path.join(core, "datasets", "gpt_dataset.py")):
        sys.exit(f"megatron_order: {core}/datasets/gpt_dataset.py not found; --megatron is the "
                 "directory holding Megatron-LM's megatron/core")

    def package(name, path):
        m = types.ModuleType(name)
        m.__path__ = [path]
        sys.modules[name] = m
        return m

    package("megatron", os.path.join(megatron_dir, "megatron"))
    package("megatron.core", core)
    sys.path.insert(0, megatron_dir)  # for modules imported by their full name below

    from megatron.core._rank_utils import log_single_rank
    utils = types.ModuleType("megatron.core.utils")
    utils.log_single_rank = log_single_rank
    sys.modules["megatron.core.utils"] = utils
    safe = types.ModuleType("megatron.core.safe_globals")
    safe.safe_numpy_load = numpy.load
    sys.modules["megatron.core.safe_globals"] = safe
    tok = types.ModuleType("megatron.core.tokenizers")
    tok.MegatronTokenizerBase = object
    sys.modules["megatron.core.tokenizers"] = tok

    spec = importlib.util.spec_from_file_location("megatron.core.datasets.helpers_cpp", helpers_path)
    helpers_cpp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers_cpp)
    sys.modules["megatron.core.datasets.helpers_cpp"] = helpers_cpp

    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    return BlendedMegatronDatasetBuilder, GPTDataset, GPTDatasetConfig


class Tokenizer:
    """What GPTDataset reads of a tokenizer: eod, and vocab_size (None: no token dtype hint).
    No pad id, so Megatron pads with -1 and masks nothing that is in the data."""
    vocab_size = None
    eod = 50256
    unique_identifiers = {"class": "Tokenizer", "eod": 50256}  # part of Megatron's cache description


def megatron_samples(mg, prefixes, weights, split, seq, seed, sizes, which, cache):
    builder_cls, gpt_cls, config_cls = mg
    config = config_cls(random_seed=seed, sequence_length=seq, blend=(prefixes, weights), split=split,
                        path_to_cache=cache, tokenizer=Tokenizer(), reset_position_ids=False,
                        reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False)
    ds = builder_cls(gpt_cls, sizes, lambda: True, config).build()[which]
    tokens, labels = [], []
    for i in range(len(ds)):
        s = ds[i]
        tokens.append(s["tokens"].numpy())
        labels.append(s["labels"].numpy())
    return numpy.stack(tokens), numpy.stack(labels)


# ---- megaengine ----

def megaengine_samples(binary, work, prefixes, weights, split, seq, seed, size, which):
    if weights is None:
        source = "prefix=" + prefixes[0]
    else:
        source = "blend=" + ",".join(f"{w!r}:{p}" for w, p in zip(weights, prefixes))
    out = os.path.join(work, "megaengine_samples.txt")
    script = os.path.join(REPO, "bench", "reference", "megatron_order_dump.lua")
    name = ("train", "valid", "test")[which]
    env = dict(os.environ, ME_ORDER_OUT=out, ME_ORDER_SPLIT=name, ME_ORDER_SEQ=str(seq), ME_ORDER_SEED=str(seed),
               ME_ORDER_SAMPLES=str(size), ME_ORDER_DATA_SPLIT=split, ME_ORDER_SOURCE=source)
    subprocess.run([binary, script], env=env, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        total = int(f.readline().split()[1])
        rows = [numpy.array(line.split(), dtype=numpy.int64) for line in f]
    assert len(rows) == 2 * total, f"{out}: {len(rows)} lines for {total} samples"
    if total == 0:
        return numpy.zeros((0, seq), numpy.int64), numpy.zeros((0, seq), numpy.int64)
    return numpy.stack(rows[0::2]), numpy.stack(rows[1::2])


# ---- data and cases ----

def make_data(binary, work):
    text = open(os.path.join(REPO, "assets", "moby-dick.txt"), encoding="utf-8").read()
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    with open(os.path.join(work, "b.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(reversed(paragraphs[1::2])))
    prefixes = []
    for name, source in (("a", os.path.join(REPO, "assets", "moby-dick.txt")), ("b", os.path.join(work, "b.txt"))):
        prefix = os.path.join(work, name)
        subprocess.run([binary, "preprocess", "--input", source, "--input-format", "text", "--output-prefix",
                        prefix, "--tokenizer", "gpt2", "--append-eod", "--workers", "4"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        prefixes.append(prefix + "_text_document")
    return prefixes


def samples_per_epoch(prefix, split, which, seq):
    """Samples in one epoch of a split, from the .idx's sequence lengths and Megatron's split rule."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix, parse_and_normalize_split)
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    data = IndexedDataset(prefix)  # held: its lengths are a view of its mapping
    lengths = data.sequence_lengths
    bookends = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))[which]
    beg, end = (int(round(b * float(len(lengths)))) for b in bookends)
    return (int(lengths[beg:end].sum()) - 1) // seq


def cases(a, b):
    """(label, prefixes, weights, split, seq, seed, sizes, which); sizes as Megatron's builder
    takes them (train, valid, test), `which` the split compared."""
    out = []
    for seq in (64, 128):
        e_train = samples_per_epoch(a, "100,0,0", 0, seq)
        for n, what in ((e_train // 2, "1 epoch"), (e_train + e_train // 4, "2 epochs, separate final"),
                        (3 * e_train - 3, "3 epochs, one shuffle")):
            out.append((f"A 100,0,0 train seq {seq} n {n} ({what})", [a], None, "100,0,0", seq, 1234, [n, 0, 0], 0))
        e_valid = samples_per_epoch(a, "98,2,0", 1, seq)
        t, v = e_train + e_train // 5, 3 * e_valid + 1
        out.append((f"A 98,2,0 train seq {seq} n {t}", [a], None, "98,2,0", seq, 42, [t, v, 0], 0))
        out.append((f"A 98,2,0 valid seq {seq} n {v} (4 epochs, separate final)", [a], None, "98,2,0", seq, 42,
                    [t, v, 0], 1))
    for which, name in ((0, "train"), (1, "valid")):
        out.append((f"blend 0.3 A + 0.7 B 98,2,0 {name} seq 64", [a, b], [0.3, 0.7], "98,2,0", 64, 1234,
                    [6000, 400, 0], which))
    out.append(("A alone with weight 1.0 (a blend of one) 100,0,0 train seq 64", [a], [1.0], "100,0,0", 64, 7,
                [4000, 0, 0], 0))
    return out


def compare(label, mine, theirs):
    (mt, ml), (tt, tl) = mine, theirs
    ok = mt.shape == tt.shape and ml.shape == tl.shape
    same = 0
    first = None
    for i in range(min(len(mt), len(tt))):
        if numpy.array_equal(mt[i], tt[i]) and numpy.array_equal(ml[i], tl[i]):
            same += 1
        elif first is None:
            first = i
    ok = ok and first is None
    print(f"{'OK  ' if ok else 'FAIL'} {label}: megatron {len(tt)} samples, megaengine {len(mt)}, identical {same}")
    if first is not None:
        print(f"     first mismatch at sample {first}: megatron tokens {tt[first][:8].tolist()}..., "
              f"megaengine {mt[first][:8].tolist()}...")
    return ok


def check_numpy():
    """Regenerates tests/unit/numpy_expectations.h with this numpy: the committed one must match."""
    gen = subprocess.run([sys.executable, os.path.join(REPO, "bench", "reference", "numpy_expectations.py")],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    committed = open(os.path.join(REPO, "tests", "unit", "numpy_expectations.h")).read().splitlines()
    strip = lambda lines: [x for x in lines if not x.startswith("// (numpy ")]
    ok = strip(gen) == strip(committed)
    print(f"{'OK  ' if ok else 'FAIL'} numpy {numpy.__version__} reproduces tests/unit/numpy_expectations.h")
    if not ok:
        import difflib
        for line in list(difflib.unified_diff(strip(committed), strip(gen), "committed", "this numpy", n=0))[:12]:
            print("     " + line[:200])
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--megatron", required=True, help="directory holding Megatron-LM's megatron/core")
    p.add_argument("--megaengine", required=True, help="the megaengine binary")
    p.add_argument("--work", required=True, help="scratch directory (data, caches, compiled helpers)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    binary = os.path.abspath(args.megaengine)
    megatron_dir = os.path.abspath(args.megatron)

    ok = check_numpy()
    mg = import_megatron(megatron_dir, compile_helpers(megatron_dir, work))
    a, b = make_data(binary, work)
    for n, (label, prefixes, weights, split, seq, seed, sizes, which) in enumerate(cases(a, b)):
        theirs = megatron_samples(mg, prefixes, weights, split, seq, seed, sizes, which,
                                  os.path.join(work, f"megatron_cache_{n}"))
        mine = megaengine_samples(binary, work, prefixes, weights, split, seq, seed, sizes[which], which)
        ok = compare(label, mine, theirs) and ok
    print("megatron_order: " + ("every sample identical" if ok else "MISMATCH"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
