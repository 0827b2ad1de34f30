# Sourced by the GPU tests that compare training runs by their loss curves
# (tp_copy_engine_gpu.sh, cuda_graphs_gpu.sh). The sourcing script sets bin (megaengine), repo,
# tmp (a directory of its own), common (the overrides every run takes) and loss_tol (follows'
# default tolerance).

# train NAME NPROC OVERRIDES...: the tiny model's run, its logged losses in $tmp/NAME.loss
train() {
  local name=$1 nproc=$2
  shift 2
  timeout 300 "$bin" --nproc "$nproc" "$repo/recipes/gpt_tiny.lua" "${common[@]}" "$@" > "$tmp/$name.log" 2>&1 ||
    { echo "FAILED: the $name run: exit $?"; tail -20 "$tmp/$name.log"; exit 1; }
  grep -o "lm loss: [0-9.E+-]*" "$tmp/$name.log" | awk '{ print $3 }' > "$tmp/$name.loss"
}

# follows REF RUN WHAT [TOL]: RUN's losses within TOL (relative; $loss_tol by default) of REF's,
# at least 6 of them
follows() {
  paste "$tmp/$1.loss" "$tmp/$2.loss" | awk -v what="$3" -v tol="${4:-$loss_tol}" '
    { d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > worst) worst = d; n++ }
    END { printf "%s%d losses compared, worst relative difference %.2e\n", what, n, worst; exit !(n >= 6 && worst < tol) }' ||
    { echo "FAILED: $2 does not follow $1's losses"; paste "$tmp/$1.loss" "$tmp/$2.loss"; exit 1; }
}
