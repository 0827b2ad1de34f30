#!/usr/bin/env bash
# Drives the REPL through a real terminal (tmux): expressions, =expr, multi-line statements,
# pretty-printed tables and engine objects, an error that does not end the session, history.
set -u
bin=$1
sock=me-repl-$$
tmp=$(mktemp -d)
cleanup() { tmux -L "$sock" kill-server 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
tmux -L "$sock" new-session -d -s repl -x 160 -y 60 "ME_HISTORY=$tmp/history $bin; echo REPL-EXITED; sleep 30"

screen() { tmux -L "$sock" capture-pane -p -t repl -S -200; }
# wait_for TEXT: polls the screen for up to 20 s
wait_for() {
  for _ in $(seq 1 100); do
    if screen | grep -qF -- "$1"; then return 0; fi
    sleep 0.2
  done
  echo "FAILED: '$1' never appeared on the REPL screen:"; screen; exit 1
}
send() { tmux -L "$sock" send-keys -t repl -l -- "$1"; tmux -L "$sock" send-keys -t repl Enter; }

wait_for "me>"
send 'x = me.tensor.ones{2,2} * 3'
send '=x:sum():item()'
wait_for "12.0"
send '1 + 41'
wait_for "42"
send 'for i = 1, 3 do'
wait_for ">>"
send '  print("line " .. i * 100)'
send 'end'
wait_for "line 300"
send 'me.model.gpt { layers = 2, hidden = 64 }'
wait_for "layers = 2,"
send 'me.model.gpt { layers = 1, hidden = 16, heads = 2, seq = 8, vocab = 50 }:build(1)'
wait_for "in the model"
send 'me.tensor.ones{2}:matmul("oops")'
wait_for "bad argument #1 to 'matmul' (tensor expected, got string)"
send 'x'
wait_for "CPUFloatType{2,2}"
tmux -L "$sock" send-keys -t repl C-d
wait_for "REPL-EXITED"
grep -qF 'me.tensor.ones{2,2}' "$tmp/history" || { echo "FAILED: history file lacks the first line"; cat "$tmp/history"; exit 1; }
echo "repl_tmux: all checks passed"
