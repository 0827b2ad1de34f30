#!/usr/bin/env bash
# The REPL in a real terminal (tmux), issue 38, item 20: docs/recipes.md's
# `me.model.gpt{...}:build()` example works without a seed (it was "bad argument #2 to
# 'build_model' (seed (integer) or build options table expected, got nil)").
set -u
bin=$1
source "$(dirname "$0")/tmux_repl.sh"
repl_start
wait_for "me>"
send 'm = me.model.gpt{ layers = 2, hidden = 64 }:build()'
send 'm'
wait_for "in the model"
keys C-d
wait_for "REPL-EXITED"
echo "repl: the docs' :build() example works"
