#!/usr/bin/env bash
# store_token.sh MEGAENGINE STORE_PROBE strangers|loopback_only
# Starts `megaengine --nproc 2 tests/cli/store_job.lua` and, while it runs, probes its
# rendezvous store:
#   strangers      no token, a wrong token, and HTTP garbage are refused and logged by the job;
#                  the right token connects (the control); the job then finishes normally
#   loopback_only  the store listens on 127.0.0.1 only: this machine's non-loopback addresses
#                  refuse the connection (skipped, saying so, when it has none)
# Bounded in time; kills what it started on any exit.
set -u
bin=$1 probe=$2 mode=$3
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/me_store_token_XXXXXX)
job=""
cleanup() {
  if [ -n "$job" ] && kill -0 "$job" 2>/dev/null; then kill -TERM "$job"; sleep 1; kill -KILL "$job" 2>/dev/null; fi
  rm -rf "$dir"
}
trap cleanup EXIT
failed=0
check() {  # check DESCRIPTION COMMAND...: runs it, prints ok/FAILED
  if "${@:2}"; then echo "ok: $1"; else echo "FAILED: $1"; failed=1; fi
}

ME_STORE_TEST_DIR=$dir "$bin" --nproc 2 "$here/store_job.lua" >"$dir/job.log" 2>&1 &
job=$!
for _ in $(seq 600); do [ -f "$dir/port" ] || ! kill -0 $job 2>/dev/null && break; sleep 0.1; done
if [ ! -f "$dir/port" ]; then
  echo "FAILED: the job never published its port"; cat "$dir/job.log"; exit 1
fi
port=$(cat "$dir/port")
echo "the job's store: port $port"

if [ "$mode" = strangers ]; then
  out=$("$probe" 127.0.0.1 "$port"); echo "no token: $out"
  check "no token is refused" grep -q "^refused: .*no job token" <<<"$out"
  out=$("$probe" 127.0.0.1 "$port" "not-the-job-token-0123456789"); echo "wrong token: $out"
  check "a wrong token is refused" grep -q "^refused: .*wrong job token" <<<"$out"
  # What a port scanner or a web client sends.
  reply=$(timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port; printf 'GET / HTTP/1.0\r\n\r\n' >&3; cat <&3" | tr -c '[:print:]' '.')
  check "HTTP garbage is refused" grep -q "refused by the rendezvous store: no job token" <<<"$reply"
  out=$("$probe" 127.0.0.1 "$port" "$(cat "$dir/token")"); echo "the job's token: $out"
  check "the job's own token connects (control)" grep -q "^connected" <<<"$out"
elif [ "$mode" = loopback_only ]; then
  if command -v ss >/dev/null; then
    listen=$(ss -Hltn "sport = :$port" | awk '{print $4}' | tr '\n' ' ')
    echo "listening sockets on port $port: $listen"
    check "the store listens on 127.0.0.1 only" test "$listen" = "127.0.0.1:$port "
  fi
  ips=$(ip -o addr show 2>/dev/null | awk '{split($4, a, "/"); print a[1]}' | grep -v -e '^127\.' -e '^::1$' -e '^fe80' || true)
  if [ -z "$ips" ]; then
    echo "SKIP: this machine has no non-loopback address to try"
  fi
  for ip in $ips; do
    out=$("$probe" "$ip" "$port" "$(cat "$dir/token")"); echo "$ip: $out"
    check "not reachable on $ip" grep -q "^unreachable: .*Connection refused" <<<"$out"
  done
fi

touch "$dir/probed"
for _ in $(seq 600); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
wait $job
rc=$?
job=""
echo "--- the job (exit $rc):"; cat "$dir/job.log"
check "the job finished normally" test $rc -eq 0
check "both ranks passed" test "$(grep -c 'test_store_job passed' "$dir/job.log")" -eq 2
if [ "$mode" = strangers ]; then
  check "the job logged the tokenless connection" grep -Eq "store: refused a connection from 127\.0\.0\.1:[0-9]+: no job token \(its first request" "$dir/job.log"
  check "the job logged the wrong token" grep -Eq "store: refused a connection from 127\.0\.0\.1:[0-9]+: wrong job token" "$dir/job.log"
  check "the job logged the garbage" grep -Eq "store: refused a connection from 127\.0\.0\.1:[0-9]+: no job token \(it sent something that is not a store request" "$dir/job.log"
fi
exit $failed
