#!/usr/bin/env bash
# Ctrl-C in the REPL (issue 38, item 20), in a real terminal (tmux): at the prompt it clears the
# line and the session goes on; in a continuation line it drops the statement; while a line runs
# (an endless loop) it stops the Lua code and the prompt comes back, the globals intact; Ctrl-D
# still exits.
set -u
bin=$1
source "$(dirname "$0")/tmux_repl.sh"
repl_start
ctrl_c() { keys C-c; }
wait_for "me>"
type_keys 'abc = undefined_thing +'
ctrl_c
wait_for "^C"
send '6 * 7'
wait_for "42"
if screen | grep -q "REPL-EXITED"; then echo "FAILED: Ctrl-C at the prompt ended the REPL"; screen; exit 1; fi
if screen | grep -q "attempt to\|unexpected symbol"; then echo "FAILED: the cleared line ran"; screen; exit 1; fi
echo "ok Ctrl-C at the prompt clears the line"
send 'for i = 1, 2 do'
wait_for ">>"
# The next statement is typed once this Ctrl-C has shown its "^C": a key typed before the handler
# has run (on a loaded machine the signal may reach another thread first, which passes it on) can
# still land in the line being cancelled. The CI saw the opening quote of the next line go so.
shown=$(screen | grep -c '\^C$')
ctrl_c
for _ in $(seq 1 100); do [ "$(screen | grep -c '\^C$')" -gt "$shown" ] && break; sleep 0.2; done
send '"after" .. "continuation"'
wait_for '"aftercontinuation"'
echo "ok Ctrl-C in a continuation line drops the statement"
send 'n = 0; while true do n = n + 1 end'
sleep 1
ctrl_c
wait_for "interrupted (Ctrl-C)"
send 'n > 0'
wait_for "true"
echo "ok Ctrl-C stops a running line; n kept counting"
# Ctrl-C right behind typed text, in the same tmux command, so it often lands while the REPL
# handles a key or before it has read the text (which the terminal then flushes). Each one must
# show "^C": the CI once lost one to the handler running on OpenBLAS's thread, and libedit's own
# handler re-raised each Ctrl-C to the process group.
before=$(screen | grep -c '\^C$')
for i in $(seq 1 20); do
  tmux -L "$sock" send-keys -t repl -l -- "burst_$i = 'some text typed before the Ctrl-C' .." \; send-keys -t repl C-c
  for _ in $(seq 1 50); do
    [ "$(screen | grep -c '\^C$')" -ge $((before + i)) ] && break
    sleep 0.1
  done
  if [ "$(screen | grep -c '\^C$')" -lt $((before + i)) ]; then
    echo "FAILED: Ctrl-C $i of 20 right behind typed text never showed '^C':"; screen; exit 1
  fi
done
send 'burst_1 == nil and "cleared"'
wait_for '"cleared"'
echo "ok 20 Ctrl-Cs right behind typed text each clear the line"
keys C-d
wait_for "REPL-EXITED"
echo "repl Ctrl-C: all passed"
