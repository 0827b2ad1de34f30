#!/usr/bin/env bash
# The docs say what a user must know to stay safe (issue 38, item 22): where they offer the dry
# run as a check, that it executes the recipe (Lua with os and io); and what
# ~/.megaengine/job_secret is.
set -u
root=$1
failed=0
need() {  # file regex what
  if ! tr '\n' ' ' < "$root/$1" | grep -Eq -- "$2"; then echo "FAILED: $1 does not say $3 (/$2/)"; failed=1; fi
}
need docs/cluster.md "execute the recipe file: a recipe is Lua with the .os. +and .io. +libraries" "that the dry run executes the recipe"
need docs/recipes.md "Dry runs.. execute the recipe \(Lua with .os. and .io." "that the dry run executes the recipe"
need docs/cluster.md "~/.megaengine/job_secret.*mode 0600" "what ~/.megaengine/job_secret is"
need docs/cluster.md "comm.rendezvous_timeout_s" "how long ranks wait for each other at the start"
[ "$failed" = 0 ] && echo "docs: the dry run's execution and the job secret are documented"
exit "$failed"
