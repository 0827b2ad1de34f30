#!/usr/bin/env bash
# The REPL in a real terminal (tmux), issue 38, item 20: Ctrl-C at the prompt drops the line
# being typed (and a multi-line statement being entered) and gives a new prompt, as a shell
# does, instead of ending the session; docs/recipes.md's `me.model.gpt{...}:build()` works.
set -u
bin=$1
sock=me-repl-int-$$
tmp=$(mktemp -d)
cleanup() { tmux -L "$sock" kill-server 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
tmux -L "$sock" new-session -d -s repl -x 160 -y 60 "ME_HISTORY=$tmp/history $bin; echo REPL-EXITED; sleep 30"
screen() { tmux -L "$sock" capture-pane -p -t repl -S -200; }
wait_for() {  # TEXT: a screen line that is exactly TEXT, or (with -F) holding it, within 20 s
  for _ in $(seq 1 100); do
    if screen | grep -q "$@"; then return 0; fi
    sleep 0.2
  done
  echo "FAILED: '$*' never appeared on the REPL screen:"; screen; exit 1
}
keys() { tmux -L "$sock" send-keys -t repl "$@"; }
send() { keys -l -- "$1"; keys Enter; }

wait_for -F "me>"
keys -l -- '99 *'; sleep 0.3; keys C-c  # a half-typed line, then Ctrl-C
sleep 0.5
send '2 + 3'                             # 5, not 99 * 2 + 3
wait_for -x "5"
send 'for i = 1, 2 do'
wait_for -F ">>"
keys C-c                                 # abandons the statement being entered
sleep 0.5
send '7 * 6'
wait_for -x "42"
send 'm = me.model.gpt{ layers = 2, hidden = 64 }:build()'
send 'm'
wait_for -F "in the model"
if screen | grep -qF "REPL-EXITED"; then echo "FAILED: the REPL ended:"; screen; exit 1; fi
keys C-d
wait_for -F "REPL-EXITED"
echo "repl_interrupt: Ctrl-C drops the line, the session goes on"
