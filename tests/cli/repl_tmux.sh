#!/usr/bin/env bash
# Drives the REPL through a real terminal (tmux): expressions, =expr, multi-line statements,
# pretty-printed tables and engine objects, an error that does not end the session, Tab
# completion (fields, methods), help(), and history kept across sessions (ME_HISTORY).
set -u
bin=$1
source "$(dirname "$0")/tmux_repl.sh"
repl_start
tab() { keys Tab; }

wait_for "me>"
# An expression typed alone prints its value, as Lua 5.4's REPL does.
send '1 + 1'
wait_for_line "2"
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
send 'x * 2'
wait_for "6  6"

# Tab completion: a field of a table, then the methods of an object after ':'.
type_keys 'me.mo'; tab
wait_for "me> me.model"
type_keys '.gp'; tab
wait_for "me> me.model.gpt"
send '.kind'  # not a table: an error, and the session goes on
wait_for "attempt to index a function value"
send 'trainer = me.trainer(dofile("recipes/gpt_tiny_bytes.lua"))'
send 'print("trainer " .. "ready")'
wait_for "trainer ready"
type_keys 'trainer:sam'; tab  # (sa: sample and save)
wait_for "me> trainer:sample"
keys C-u
type_keys 'trainer:'; tab; tab  # ambiguous: the second Tab lists every method
wait_for "trainer:evaluate"
wait_for "trainer:iteration"
keys C-u

# A run in the REPL: on a terminal the progress line carries the time left, "(ETA ...)".
send 'r = dofile("recipes/gpt_tiny_bytes.lua"); me.apply_overrides(r, {"train.iters=6", "train.log_interval=2", "train.eval_iters=0", "sample.tokens=0", "schedule.warmup_iters=1", "batch.micro=2", "model.seq=32"}); s = me.trainer(r):run()'
wait_for "(ETA " 90  # a loaded machine (ctest -j) may take long over the first steps
wait_for "iteration        6/       6" 90

# help(): a constructor's fields with their defaults and help, a section by name, an object's methods.
send 'help(me.model.gpt)'
wait_for "model.gpt -- me.model.gpt{...}"
screen | grep -qE '^  hidden +integer +128 +hidden size$' || { echo "FAILED: help(me.model.gpt) does not list hidden with its default 128:"; screen; exit 1; }
send 'help("parallel")'
wait_for "tp_comm_overlap"
send 'help(trainer)'
wait_for "trainer (me.Trainer): methods, called as trainer:<name>(...)"
keys C-d
wait_for "REPL-EXITED"
grep -qF 'me.tensor.ones{2,2}' "$tmp/history" || { echo "FAILED: history file lacks the first line"; cat "$tmp/history"; exit 1; }

# A second session finds the first one's lines in its history (Up recalls the last of them).
# It gets a server of its own: a new one on the old socket can race the old one's exit.
tmux -L "$sock" kill-server 2>/dev/null
repl_start "$sock-2"
wait_for "me>"
keys Up
wait_for "me> help(trainer)"
keys C-u C-d
wait_for "REPL-EXITED"
echo "repl_tmux: all checks passed"
