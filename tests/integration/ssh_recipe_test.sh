#!/usr/bin/env bash
# The `ssh host 'quantem-gpu serve ...'` recipes of docs/connect.md, run with
# the real ssh against a throwaway sshd on a high loopback port: when the SSH
# session closes, the daemon stops cleanly (exit 0, runtime file removed):
#   ssh -t host 'quantem-gpu serve ...'                         (the terminal's hang-up)
#   ssh host 'quantem-gpu serve ... --exit-on-stdin-close'      (the end of stdin)
# and the old form without either keeps serving with its log stream closed
# (it must be stopped by the user; connect.md says so).
# Skipped (exit 77) without sshd/ssh (scripts/install-deps.sh --test installs them).
# Usage: ssh_recipe_test.sh QUANTEM_BINARY
set -euo pipefail
binary="$(realpath "$1")"
sshd="$(command -v sshd || echo /usr/sbin/sshd)"
if [[ ! -x "$sshd" ]] || ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
  echo "ssh_recipe_test: SKIPPED: sshd, ssh or ssh-keygen is not installed (apt-get install openssh-server openssh-client)"
  exit 77
fi
work="$(mktemp -d)"
chmod 700 "$work"
sshd_pid=""
client_pid=""
cleanup() {
  [[ -n "$client_pid" ]] && kill "$client_pid" 2>/dev/null || true
  [[ -n "$sshd_pid" ]] && kill "$sshd_pid" 2>/dev/null || true
  local file
  for file in "$work"/runtime/server-*.json; do  # daemons this test started that are still running
    [[ -e "$file" ]] && kill -KILL "$(basename "$file" .json | sed 's/^server-//')" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "ssh_recipe_test: FAILED: $*" >&2; exit 1; }

# --- a private sshd: its own host key, our key only, this user only --------------------
ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/client_key"
cp "$work/client_key.pub" "$work/authorized_keys"
mkdir -p /run/sshd 2>/dev/null || true  # privilege separation folder (root only)
port=""
for candidate in $(shuf -i 20000-60000 -n 20); do
  "$sshd" -D -e -p "$candidate" -h "$work/host_key" -o ListenAddress=127.0.0.1 \
    -o AuthorizedKeysFile="$work/authorized_keys" -o PasswordAuthentication=no -o UsePAM=no \
    -o PidFile="$work/sshd.pid" -o StrictModes=no -o PermitRootLogin=prohibit-password \
    -o AllowUsers="$(id -un)" 2>"$work/sshd.log" &
  sshd_pid=$!
  for _ in $(seq 50); do
    grep -q "Server listening" "$work/sshd.log" && break
    kill -0 "$sshd_pid" 2>/dev/null || break
    sleep 0.1
  done
  if grep -q "Server listening" "$work/sshd.log"; then port="$candidate"; break; fi
  kill "$sshd_pid" 2>/dev/null || true
  sshd_pid=""
done
if [[ -z "$port" ]]; then
  echo "ssh_recipe_test: SKIPPED: sshd does not start here: $(cat "$work/sshd.log")"
  exit 77
fi
ssh_options=(-p "$port" -i "$work/client_key" -o BatchMode=yes -o StrictHostKeyChecking=no
  -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR)
host="$(id -un)@127.0.0.1"
ssh "${ssh_options[@]}" "$host" true || fail "ssh to the private sshd: $(cat "$work/sshd.log")"

"$binary" synth "$work/data/sample1" --scan 4x4 --detector 8x8 --threads 1 >/dev/null
runtime="$work/runtime"
serve="QUANTEM_GPU_RUNTIME_DIR=$runtime '$binary' serve '$work/data' --backend cpu --port 0"

# Waits for the port file $1, then for the runtime file; prints the daemon's pid.
wait_listening() {
  for _ in $(seq 300); do [[ -s "$1" ]] && break; sleep 0.1; done
  [[ -s "$1" ]] || return 1
  curl -fsS "http://127.0.0.1:$(cat "$1")/api/health/live" >/dev/null || return 1
  local file
  file="$(ls "$runtime"/server-*.json 2>/dev/null | head -n1)"
  [[ -n "$file" ]] || return 1
  basename "$file" .json | sed 's/^server-//'
}
# Waits until pid $1 has gone and its runtime file with it.
wait_stopped() {
  for _ in $(seq 300); do
    if ! kill -0 "$1" 2>/dev/null && [[ ! -e "$runtime/server-$1.json" ]]; then return 0; fi
    sleep 0.1
  done
  return 1
}

# --- connect.md: ssh -t (the terminal's hang-up stops the daemon) ------------------------
# -tt: a terminal although this script's stdin is none (an interactive ssh -t gets one anyway).
ssh -tt "${ssh_options[@]}" "$host" "$serve --port-file $work/port1 2>$work/daemon1.log" </dev/null >/dev/null 2>&1 &
client_pid=$!
pid="$(wait_listening "$work/port1")" || fail "the daemon over ssh -t did not start: $(cat "$work/daemon1.log" 2>/dev/null)"
kill "$client_pid"  # the SSH session closes
wait "$client_pid" 2>/dev/null || true
client_pid=""
wait_stopped "$pid" || fail "the daemon outlived its ssh -t session: $(cat "$work/daemon1.log")"
grep -q '(SIGHUP) received: stopping' "$work/daemon1.log" || fail "no clean stop: $(cat "$work/daemon1.log")"
grep -q 'stopped$' "$work/daemon1.log" || fail "no clean stop: $(cat "$work/daemon1.log")"

# --- connect.md: a launcher without a terminal, --exit-on-stdin-close ---------------------
rm -f "$work/port2"
coproc SSH_SESSION { ssh "${ssh_options[@]}" "$host" "$serve --port-file $work/port2 --exit-on-stdin-close 2>$work/daemon2.log"; }
client_pid=$SSH_SESSION_PID
pid="$(wait_listening "$work/port2")" || fail "the daemon over ssh did not start: $(cat "$work/daemon2.log" 2>/dev/null)"
kill "$client_pid"  # the SSH session closes: sshd closes the daemon's stdin
wait "$client_pid" 2>/dev/null || true
client_pid=""
wait_stopped "$pid" || fail "the daemon outlived its ssh session: $(cat "$work/daemon2.log")"
grep -q 'standard input reached its end' "$work/daemon2.log" || fail "no clean stop: $(cat "$work/daemon2.log")"

# --- without either, the log stream closes with the session: the daemon keeps serving ----
rm -f "$work/port3"
coproc SSH_OLD { ssh "${ssh_options[@]}" "$host" "$serve --port-file $work/port3"; }
client_pid=$SSH_OLD_PID
pid="$(wait_listening "$work/port3")" || fail "the daemon over ssh did not start"
kill "$client_pid"
wait "$client_pid" 2>/dev/null || true
client_pid=""
sleep 1
kill -USR1 "$pid" 2>/dev/null || true  # a log line into the closed stream
sleep 0.5
curl -fsS "http://127.0.0.1:$(cat "$work/port3")/api/health/live" >/dev/null ||
  fail "a closed log stream stopped the daemon"
kill -TERM "$pid"
wait_stopped "$pid" || fail "SIGTERM did not stop the daemon cleanly"

echo "ssh_recipe_test: ssh -t and --exit-on-stdin-close stop the daemon cleanly when the session closes"
