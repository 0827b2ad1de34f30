#!/usr/bin/env bash
# The REPL in a real terminal (tmux), issue 38, item 20: docs/recipes.md's
# `me.model.gpt{...}:build()` example works without a seed (it was "bad argument #2 to
# 'build_model' (seed (integer) or build options table expected, got nil)").
set -u
bin=$1
sock=me-repl-build-$$
tmp=$(mktemp -d)
cleanup() { tmux -L "$sock" kill-server 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
tmux -L "$sock" new-session -d -s repl -x 160 -y 60 "ME_HISTORY=$tmp/history $bin; echo REPL-EXITED; sleep 30"
screen() { tmux -L "$sock" capture-pane -p -t repl -S -200; }
wait_for() {
  for _ in $(seq 1 100); do
    if screen | grep -qF -- "$1"; then return 0; fi
    sleep 0.2
  done
  echo "FAILED: '$1' never appeared on the REPL screen:"; screen; exit 1
}
send() { tmux -L "$sock" send-keys -t repl -l -- "$1"; tmux -L "$sock" send-keys -t repl Enter; }
wait_for "me>"
send 'm = me.model.gpt{ layers = 2, hidden = 64 }:build()'
send 'm'
wait_for "in the model"
tmux -L "$sock" send-keys -t repl C-d
wait_for "REPL-EXITED"
echo "repl: the docs' :build() example works"
