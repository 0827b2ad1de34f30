#!/usr/bin/env bash
# Ctrl-C in the REPL (issue 38, item 20), in a real terminal (tmux): at the prompt it clears the
# line and the session goes on; in a continuation line it drops the statement; while a line runs
# (an endless loop) it stops the Lua code and the prompt comes back, the globals intact; Ctrl-D
# still exits.
set -u
bin=$1
sock=me-repl-ctrlc-$$
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
keys() { tmux -L "$sock" send-keys -t repl -l -- "$1"; }
enter() { tmux -L "$sock" send-keys -t repl Enter; }
ctrl_c() { tmux -L "$sock" send-keys -t repl C-c; }
wait_for "me>"
keys 'abc = undefined_thing +'
ctrl_c
wait_for "^C"
keys '6 * 7'; enter
wait_for "42"
if screen | grep -q "REPL-EXITED"; then echo "FAILED: Ctrl-C at the prompt ended the REPL"; screen; exit 1; fi
if screen | grep -q "attempt to\|unexpected symbol"; then echo "FAILED: the cleared line ran"; screen; exit 1; fi
echo "ok Ctrl-C at the prompt clears the line"
keys 'for i = 1, 2 do'; enter
wait_for ">>"
ctrl_c
keys '"after" .. "continuation"'; enter
wait_for '"aftercontinuation"'
echo "ok Ctrl-C in a continuation line drops the statement"
keys 'n = 0; while true do n = n + 1 end'; enter
sleep 1
ctrl_c
wait_for "interrupted (Ctrl-C)"
keys 'n > 0'; enter
wait_for "true"
echo "ok Ctrl-C stops a running line; n kept counting"
tmux -L "$sock" send-keys -t repl C-d
wait_for "REPL-EXITED"
echo "repl Ctrl-C: all passed"
