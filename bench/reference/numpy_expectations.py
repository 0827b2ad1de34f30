#!/usr/bin/env python3
"""Writes tests/unit/numpy_expectations.h: numpy's own outputs that engine/data/numpy_random
must reproduce (tests/unit/test_numpy_random.cpp checks them).

    /usr/bin/python3 bench/reference/numpy_expectations.py > tests/unit/numpy_expectations.h

Needs only numpy (Debian: apt-get install python3-numpy). numpy's legacy RandomState stream is
frozen across versions, so any numpy gives the same header; the one it was made with is named
in the header. What each array is:
  - raw: RandomState(1234).randint(0, 2**32, size=20, dtype=np.uint32): for the full 32-bit
    range numpy returns next_uint32() itself, no masking or rejection
    (random_bounded_uint32_fill, rng == 0xFFFFFFFF);
  - intervals: one RandomState(seed) drawing randint(0, max + 1, dtype=np.uint64) for each max
    in turn: with the legacy masked method this is random_interval(max), the draw that shuffle
    uses, with 32-bit draws below 2^32 and 64-bit ones above;
  - shuffles: RandomState(seed).shuffle(np.arange(n)) for n in {10, 1000} in full, and for
    n = 2^20 a few positions and the FNV-1a 64 hash of the permutation's int64 little-endian
    bytes;
  - sums: numpy.sum of the float64 array [1/1, 1/2, ..., 1/n] (each an exactly rounded division,
    so C++ builds the same array) for several n, as hex floats.
"""
import numpy as np

SEEDS = (1234, 42)
INTERVAL_MAXES = (0, 1, 2, 5, 1000, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1,
                  3 * 2**40 + 12345, 2**63 - 1, 2**63, 2**64 - 2)
BIG = 2**20
BIG_POSITIONS = (0, 1, 2, 12345, BIG // 2, BIG - 2, BIG - 1)
SUM_SIZES = (3, 7, 8, 10, 100, 128, 129, 1000, 8192, 8193, 20000)


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def shuffled(seed: int, n: int) -> np.ndarray:
    a = np.arange(n, dtype=np.int64)
    np.random.RandomState(seed).shuffle(a)
    return a


def cpp_array(name: str, ctype: str, values, per_line: int = 10) -> str:
    items = [f"{int(v)}u" if ctype.startswith("uint") else str(int(v)) for v in values]
    if ctype == "uint64_t":
        items = [f"{int(v)}ull" for v in values]
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    body = ",\n    ".join(lines)
    return f"inline const std::vector<{ctype}> {name} = {{\n    {body}}};\n"


def main() -> None:
    out = [
        "// numpy's own outputs for tests/unit/test_numpy_random.cpp. Generated, do not edit:",
        "//   /usr/bin/python3 bench/reference/numpy_expectations.py > tests/unit/numpy_expectations.h",
        f"// (numpy {np.__version__}; the legacy RandomState stream is the same in every numpy.)",
        "#pragma once",
        "#include <cstdint>",
        "#include <vector>",
        "",
        "namespace numpy_expect {",
        "",
        "// RandomState(1234).randint(0, 2**32, size=20, dtype=np.uint32): raw 32-bit draws.",
        cpp_array("kRaw1234", "uint32_t",
                  np.random.RandomState(1234).randint(0, 2**32, size=20, dtype=np.uint32)),
        cpp_array("kIntervalMaxes", "uint64_t", INTERVAL_MAXES, per_line=4),
    ]
    for seed in SEEDS:
        rs = np.random.RandomState(seed)
        draws = [rs.randint(0, m + 1, dtype=np.uint64) for m in INTERVAL_MAXES]
        out.append(f"// One RandomState({seed}): randint(0, max + 1, dtype=np.uint64) for each max in turn.")
        out.append(cpp_array(f"kIntervals{seed}", "uint64_t", draws, per_line=4))
        for n in (10, 1000):
            out.append(f"// RandomState({seed}).shuffle(np.arange({n}))")
            out.append(cpp_array(f"kShuffle{seed}_{n}", "int64_t", shuffled(seed, n), per_line=16))
        big = shuffled(seed, BIG)
        out.append(f"// RandomState({seed}).shuffle(np.arange(2**20)) at kBigPositions, and the FNV-1a 64 of")
        out.append("// its int64 little-endian bytes.")
        out.append(cpp_array(f"kShuffle{seed}_big_at", "int64_t", big[list(BIG_POSITIONS)]))
        out.append(f"inline constexpr uint64_t kShuffle{seed}_big_fnv = "
                   f"{fnv1a64(big.astype('<i8').tobytes())}ull;\n")
    out.append(cpp_array("kBigPositions", "int64_t", BIG_POSITIONS))
    out.append("// numpy.sum(1.0 / np.arange(1, n + 1)) for each n of kSumSizes.")
    out.append(cpp_array("kSumSizes", "int64_t", SUM_SIZES))
    sums = [float(np.sum(1.0 / np.arange(1, n + 1, dtype=np.float64))).hex() for n in SUM_SIZES]
    out.append("inline const std::vector<double> kSums = {\n    " + ",\n    ".join(sums) + "};\n")
    out.append(f"inline constexpr int64_t kBig = {BIG};\n")
    out.append("}  // namespace numpy_expect")
    print("\n".join(out))


if __name__ == "__main__":
    main()
