#!/usr/bin/env bash
# `megaengine plan` and parallel = "auto" (engine/plan/layout_search.h) from the command line:
# 1. the user's recipes on 2 nodes of 8 H100s: a layout that fits 80 GB, with its step time,
#    MFU, days for the recipe's samples and what tensor parallelism across nodes would cost;
# 2. parallel.auto resolved to a concrete layout in --dry-run (the dry run's layout table shows it);
# 3. --plan trains with the chosen layout (2 CPU ranks);
# 4. a bad profile file, an unknown --gpu and a model that fits no layout: exit 1 and a message
#    naming the field, the known profiles, or the largest memory term and what would fit;
# 5. --calibrate on the CPU over 2 ranks (Gloo) writes a profile that plans with --profile.
set -euo pipefail
bin=$1
repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $1"; sed -n 1,40p "$2"; exit 1; }

for r in gpt39b llama2_70b; do
  "$bin" plan "$repo/recipes/$r.lua" --nodes 2 --gpus-per-node 8 > "$tmp/$r.out" 2>&1 || fail "$r: exit $?" "$tmp/$r.out"
  grep -q "^#1  tp [1248] x pp [0-9]* x dp [0-9]*" "$tmp/$r.out" || fail "$r: no first layout" "$tmp/$r.out"
  grep -Eq "memory [0-9.]+ GB of 80.0 GB, [0-9.]+ days for [0-9]+ samples" "$tmp/$r.out" || fail "$r: no memory and days" "$tmp/$r.out"
  grep -q "MFU [0-9.]*%" "$tmp/$r.out" || fail "$r: no MFU" "$tmp/$r.out"
  grep -q "^tensor parallelism across nodes: .* on the inter-node link" "$tmp/$r.out" ||
    fail "$r: no word on tensor parallelism across nodes" "$tmp/$r.out"
  mem=$(sed -n 's/.*memory \([0-9.]*\) GB of 80.0 GB.*/\1/p' "$tmp/$r.out" | head -1)
  awk -v m="$mem" 'BEGIN { exit !(m > 0 && m <= 80) }' || fail "$r: first layout needs $mem GB" "$tmp/$r.out"
  echo "ok plan $r: $(grep -m1 '^#1' "$tmp/$r.out")"
done

"$bin" --dry-run "$repo/recipes/gpt_tiny.lua" --world 4 --gpus-per-node 4 parallel.auto=true > "$tmp/auto.out" 2>&1 ||
  fail "dry run with parallel.auto: exit $?" "$tmp/auto.out"
choice=$(sed -n 's/^parallel.auto: tp \([0-9]*\) x pp \([0-9]*\) x dp \([0-9]*\).*/\1 \2 \3/p' "$tmp/auto.out")
[ -n "$choice" ] || fail "dry run: no parallel.auto line" "$tmp/auto.out"
read -r tp pp dp <<< "$choice"
grep -Eq "world 4 = tp $tp x (cp 1 x )?dp $dp x pp $pp" "$tmp/auto.out" ||
  grep -Eq "tp=$tp.*pp=$pp|tp $tp .*pp $pp" "$tmp/auto.out" || fail "dry run: the layout is not tp $tp x pp $pp" "$tmp/auto.out"
grep -q "^estimated step time on h100-80gb: " "$tmp/auto.out" || fail "dry run: no step-time estimate" "$tmp/auto.out"
echo "ok dry run parallel.auto: tp $tp x pp $pp x dp $dp"

timeout 300 "$bin" --nproc 2 "$repo/recipes/gpt_tiny.lua" --plan train.iters=4 train.log_interval=2 schedule.warmup_iters=0 > "$tmp/run.out" 2>&1 ||
  fail "--plan run: exit $?" "$tmp/run.out"
grep -q "parallel.auto: tp [12] x pp [12] x dp [12]" "$tmp/run.out" || fail "--plan run: no chosen layout logged" "$tmp/run.out"
grep -Eq "iteration +4/ +4" "$tmp/run.out" || fail "--plan run: did not train 4 iterations" "$tmp/run.out"
echo "ok --plan run: $(grep -o 'parallel.auto: [^(]*' "$tmp/run.out" | head -1)"

echo '{"name": "x", "gpu": "y", "source": "z", "memory_gb": 80}' > "$tmp/bad.json"
rc=0; "$bin" plan "$repo/recipes/gpt39b.lua" --profile "$tmp/bad.json" > "$tmp/bad.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "bad profile: exit $rc, expected 1" "$tmp/bad.out"
grep -q "profile $tmp/bad.json: missing field 'matmul_tflops'" "$tmp/bad.out" || fail "bad profile: field not named" "$tmp/bad.out"
rc=0; "$bin" plan "$repo/recipes/gpt39b.lua" --gpu a100 > "$tmp/gpu.out" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "not a known profile; built in: h100-80gb, h200-141gb" "$tmp/gpu.out" || fail "unknown --gpu: exit $rc" "$tmp/gpu.out"
rc=0; "$bin" plan "$repo/recipes/llama2_70b.lua" --nodes 1 --gpus-per-node 4 > "$tmp/big.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "no layout fits: exit $rc, expected 1" "$tmp/big.out"
grep -q "the largest term is .*it would fit on [0-9]* nodes of 4 GPUs" "$tmp/big.out" || fail "no layout fits: no largest term / what would fit" "$tmp/big.out"
echo "ok refusals: $(head -c 300 "$tmp/big.out")"
timeout 300 "$bin" --nproc 2 plan --calibrate "$tmp/cpu.json" --device cpu --name cpu-test > "$tmp/cal.out" 2>&1 ||
  fail "calibrate: exit $?" "$tmp/cal.out"
grep -q "calibrate: all_gather over 2 ranks" "$tmp/cal.out" || fail "calibrate: no collectives measured" "$tmp/cal.out"
grep -q '"name": "cpu-test"' "$tmp/cpu.json" || fail "calibrate: profile not written" "$tmp/cal.out"
"$bin" plan "$repo/recipes/gpt_tiny.lua" --nodes 1 --gpus-per-node 2 --profile "$tmp/cpu.json" > "$tmp/cpuplan.out" 2>&1 ||
  fail "plan with the calibrated profile: exit $?" "$tmp/cpuplan.out"
grep -q "^profile: cpu-test (cpu, " "$tmp/cpuplan.out" && grep -q "^#1  tp" "$tmp/cpuplan.out" ||
  fail "plan with the calibrated profile: no ranking" "$tmp/cpuplan.out"
echo "ok calibrate: $(grep -m1 '^#1' "$tmp/cpuplan.out")"
echo "plan: all passed"
