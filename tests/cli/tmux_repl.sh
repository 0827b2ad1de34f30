# Sourced by the REPL tests (repl_tmux.sh, repl_interrupt.sh, repl_ctrl_c.sh): the REPL in a real
# terminal, a tmux server of the test's own. Needs $bin (the megaengine binary); sets $tmp (removed
# at exit, with every server started here) and $sock.
#   repl_start [SOCKET]      start `$bin` (no arguments) with ME_HISTORY=$tmp/history
#   screen                   what the terminal shows, scrollback included
#   wait_for TEXT [SECONDS]  poll the screen for TEXT (20 s), else fail with the screen
#   wait_for_line TEXT       poll for a line that is exactly TEXT (a bare value such as "2")
#   type_keys TEXT, send TEXT (then Enter), keys KEY... (tmux key names: C-c, C-d, Tab, Up)
tmp=$(mktemp -d)
repl_sockets=()
repl_cleanup() {
  for s in "${repl_sockets[@]}"; do tmux -L "$s" kill-server 2>/dev/null; done
  rm -rf "$tmp"
}
trap repl_cleanup EXIT
repl_start() {
  sock=${1:-me-repl-$$}
  repl_sockets+=("$sock")
  tmux -L "$sock" new-session -d -s repl -x 160 -y 60 "ME_HISTORY=$tmp/history $bin; echo REPL-EXITED; sleep 30"
}
screen() { tmux -L "$sock" capture-pane -p -t repl -S -200; }
wait_for() {
  for _ in $(seq 1 $((${2:-20} * 5))); do
    if screen | grep -qF -- "$1"; then return 0; fi
    sleep 0.2
  done
  echo "FAILED: '$1' never appeared on the REPL screen:"; screen; exit 1
}
wait_for_line() {
  for _ in $(seq 1 100); do
    if screen | grep -qxF -- "$1"; then return 0; fi
    sleep 0.2
  done
  echo "FAILED: no line '$1' on the REPL screen:"; screen; exit 1
}
type_keys() { tmux -L "$sock" send-keys -t repl -l -- "$1"; }
keys() { tmux -L "$sock" send-keys -t repl "$@"; }
send() { type_keys "$1"; keys Enter; }
