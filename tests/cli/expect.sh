#!/usr/bin/env bash
# expect.sh ok|fail REGEX -- COMMAND...
# Runs COMMAND and checks its exit status (0 for ok, non-zero for fail) and that its output
# (stdout + stderr, newlines folded to spaces) matches the extended REGEX. A C++ exception
# dump or a crash fails the test whatever the regex says.
set -u
mode=$1 regex=$2
shift 3
# Every process the command starts inherits this token, so survivors can be found exactly.
token="me-expect-$$-$RANDOM$RANDOM"
out=$(ME_EXPECT_TOKEN=$token timeout "${EXPECT_TIMEOUT:-250}" "$@" 2>&1)
rc=$?
flat=$(printf '%s' "$out" | tr '\n' ' ')
problem=""
if [ "$mode" = ok ] && [ $rc -ne 0 ]; then problem="expected exit 0, got $rc"; fi
if [ "$mode" = fail ] && { [ $rc -eq 0 ] || [ $rc -ge 124 ]; }; then problem="expected a clean non-zero exit, got $rc"; fi
if ! printf '%s' "$flat" | grep -Eq -- "$regex"; then problem="${problem:+$problem; }output does not match /$regex/"; fi
if printf '%s' "$out" | grep -Eq 'terminate called|Exception raised from|frame #[0-9]|Segmentation fault|core dumped'; then
  problem="${problem:+$problem; }output holds a C++ exception dump or crash"
fi
# Nothing the command started may outlive it (ranks, their children, orphans included).
sleep 0.3
left=$(grep -lzx "ME_EXPECT_TOKEN=$token" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | tr '\n' ' ')
if [ -n "${left// /}" ]; then
  problem="${problem:+$problem; }processes left behind: $(ps -o pid=,args= -p "$(echo $left | tr ' ' ',')" 2>/dev/null | tr '\n' ';')"
  kill -9 $left 2>/dev/null
fi
if [ -n "$problem" ]; then
  printf 'FAILED: %s\n--- command: %s\n--- exit: %d\n--- output:\n%s\n' "$problem" "$*" "$rc" "$out"
  exit 1
fi
printf 'ok (exit %d): %s\n' "$rc" "$(printf '%s' "$out" | head -c 400)"
