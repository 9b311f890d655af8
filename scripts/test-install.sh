#!/usr/bin/env bash
# The deployment of docs/deploy.md, checked from a build folder (CI: called by
# scripts/test.sh): install into a temporary prefix, run the installed binary,
# verify the installed systemd user unit, then start the daemon exactly as the
# unit's ExecStart= would (its EnvironmentFile, its $NOTIFY_SOCKET) and ask it
# with curl. A systemd user manager does not run in CI containers, so the
# unit is checked with `systemd-analyze --user verify` (syntax, directives,
# ExecStart= executable) and the notify protocol with our own socket.
# Usage: scripts/test-install.sh [BUILD_DIR]   (default build-test)
set -euo pipefail
# Outputs are checked with grep <<<"$(command)", not command | grep -q, so that
# grep leaving early never fails a pipeline through SIGPIPE.
cd "$(dirname "$0")/.."
build="${1:-build-test}"
work="$(mktemp -d)"
daemon_pid=""
receiver_pid=""
cleanup() {
  [[ -n "$daemon_pid" ]] && kill "$daemon_pid" 2>/dev/null || true
  [[ -n "$receiver_pid" ]] && kill "$receiver_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "test-install: FAILED: $*" >&2; exit 1; }

# --- install (deploy.md "Install") ----------------------------------------------
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
bin="$prefix/bin/quantem-gpu"
unit="$prefix/share/quantem-gpu/systemd/quantem-gpu.service"
example="$prefix/share/quantem-gpu/quantem-gpu.env.example"
for f in "$bin" "$unit" "$example" "$prefix/share/doc/quantem-gpu/deploy.md" "$prefix/share/doc/quantem-gpu/connect.md"; do
  [[ -e "$f" ]] || fail "$f was not installed"
done
grep -q '^quantem-gpu ' <<<"$("$bin" version)" || fail "version"
grep -q -- '--port' <<<"$("$bin" serve --help)" || fail "serve --help"
grep -Eq '^CUDA: (not available in this build|driver)' <<<"$("$bin" info)" || fail "info"
grep -qx "ExecStart=$bin serve \${QUANTEM_GPU_DATA_FOLDER} \$QUANTEM_GPU_LISTEN \$QUANTEM_GPU_OPTIONS" "$unit" ||
  fail "the unit's ExecStart does not name the installed binary"

# --- the unit (deploy.md "The user service") ----------------------------------------
export HOME="$work/home"
unset QUANTEM_GPU_RUNTIME_DIR QUANTEM_GPU_TOKEN QUANTEM_GPU_TOKEN_FILE JOURNAL_STREAM
mkdir -p "$HOME/.config/systemd/user" "$HOME/.config/quantem-gpu" "$work/xdg"
chmod 700 "$work/xdg"
cp "$unit" "$HOME/.config/systemd/user/"
cp "$example" "$HOME/.config/quantem-gpu/quantem-gpu.env"
verify_output="$(XDG_RUNTIME_DIR="$work/xdg" systemd-analyze --user --man=no verify \
  "$HOME/.config/systemd/user/quantem-gpu.service" 2>&1)" || fail "systemd-analyze verify: $verify_output"
[[ -z "$verify_output" ]] || fail "systemd-analyze verify warned: $verify_output"
# deploy.md "Exit statuses", "Reload": no restart on a refused configuration,
# a start limit, and reload = SIGHUP.
for directive in 'RestartPreventExitStatus=2 78' 'StartLimitIntervalSec=300' 'StartLimitBurst=5' \
  'ExecReload=/bin/kill -HUP $MAINPID' 'SyslogLevelPrefix=true' \
  'Environment="QUANTEM_GPU_LISTEN=--unix-socket %t/quantem-gpu/quantem.sock"'; do
  grep -qxF "$directive" "$unit" || fail "the unit lacks $directive"
done

# --- start it as systemd would ------------------------------------------------------
"$bin" synth "$work/data/sample1" --scan 8x8 --detector 16x16 --threads 2 >/dev/null
env_file="$HOME/.config/quantem-gpu/quantem-gpu.env"
installed_unit="$HOME/.config/systemd/user/quantem-gpu.service"
export XDG_RUNTIME_DIR="$work/xdg"
# The unit's environment: its Environment= lines (%t: $XDG_RUNTIME_DIR), then
# the EnvironmentFile's KEY=VALUE lines, taken literally, the later winning.
load_unit_environment() {
  unset QUANTEM_GPU_LISTEN QUANTEM_GPU_OPTIONS QUANTEM_GPU_TOKEN_FILE QUANTEM_GPU_LOG_LEVEL
  local line
  while IFS= read -r line; do
    line="${line//%t/$XDG_RUNTIME_DIR}"
    [[ "$line" =~ ^([A-Z_][A-Z0-9_]*)=(.*)$ ]] && export "${BASH_REMATCH[1]}=${BASH_REMATCH[2]}"
  done < <(sed -n 's/^Environment="\?\([^"]*\)"\?$/\1/p' "$installed_unit"; cat "$env_file")
}
# Sets KEY=VALUE in the environment file (replacing the line or its commented example).
set_env() { sed -i -e "/^#\?$1=/d" "$env_file"; echo "$1=$2" >>"$env_file"; }
# Waits (30 s at most) until a daemon answers /api/health/ready on the Unix socket $1.
wait_ready_on_socket() {
  for _ in $(seq 300); do
    curl -fsS --unix-socket "$1" http://localhost/api/health/ready >/dev/null 2>&1 && return
    sleep 0.1
  done
}
exec_start="$(sed -n 's/^ExecStart=//p' "$installed_unit")"
exec_reload="$(sed -n 's/^ExecReload=//p' "$installed_unit")"

# The example environment as installed (only the data folder and --backend cpu
# changed): it listens on the Unix socket only, which no other account can open.
set_env QUANTEM_GPU_DATA_FOLDER "$work/data"
set_env QUANTEM_GPU_OPTIONS "--backend cpu"
load_unit_environment
eval "set -- $exec_start"
[[ "$*" != *--port* && "$*" == *"--unix-socket $XDG_RUNTIME_DIR/quantem-gpu/quantem.sock"* ]] ||
  fail "the example environment does not default to the Unix socket: $*"
mkdir -m 700 "$XDG_RUNTIME_DIR/quantem-gpu"   # RuntimeDirectory=
"$@" 2>"$work/default.log" &
daemon_pid=$!
wait_ready_on_socket "$XDG_RUNTIME_DIR/quantem-gpu/quantem.sock"
grep -q '"ready":true' <<<"$(curl -fsS --unix-socket "$XDG_RUNTIME_DIR/quantem-gpu/quantem.sock" \
  http://localhost/api/health/ready)" || fail "the default socket does not serve: $(cat "$work/default.log")"
# deploy.md "Reload": ExecReload= (SIGHUP) reads the catalog again; the daemon keeps serving.
"$bin" synth "$work/data/sample2" --scan 4x4 --detector 16x16 --threads 2 >/dev/null
MAINPID="$daemon_pid" eval "$(sed 's/\$MAINPID/$MAINPID/' <<<"$exec_reload")"
for _ in $(seq 100); do grep -q 'was read again (2 sessions)' "$work/default.log" && break; sleep 0.1; done
grep -q 'was read again (2 sessions)' "$work/default.log" || fail "reload did not read the catalog: $(cat "$work/default.log")"
kill -0 "$daemon_pid" || fail "reload stopped the daemon"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || fail "the default daemon exited with $? on SIGTERM"
daemon_pid=""

# The example's --gpus auto on a host without a usable GPU: exit 78 (in
# RestartPreventExitStatus=, so systemd does not restart it), and the reason
# at error priority in the journal.
set_env QUANTEM_GPU_OPTIONS "--gpus auto"
load_unit_environment
eval "set -- $exec_start"
if [[ -z "$(sed -n 's/^GPU [0-9]*: //p' <<<"$("$bin" info)")" ]]; then
  status=0
  JOURNAL_STREAM=8:1 "$@" 2>"$work/no-gpu.log" || status=$?
  [[ "$status" == 78 ]] || fail "--gpus auto without a GPU exited $status, not 78: $(cat "$work/no-gpu.log")"
  grep -q '^<3>CUDA unavailable: ' "$work/no-gpu.log" || fail "the reason is not at error priority: $(cat "$work/no-gpu.log")"
  grep -q '^advice: no usable GPU' <<<"$("$bin" info)" || fail "info gives no advice without a GPU"
fi

# TCP, as the example's commented lines show it (here an ephemeral port).
set_env QUANTEM_GPU_LISTEN "--port 0"
set_env QUANTEM_GPU_OPTIONS "--backend cpu --port-file $work/port"
load_unit_environment
# ${VAR}: one word; $VAR: split on spaces (systemd.service(5)); no spaces in these values.
eval "set -- $exec_start"

python3 - "$work/notify.sock" >"$work/notify.log" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
print("BOUND", flush=True)
s.settimeout(120)
while True:
    message = s.recv(4096).decode()
    print(message.replace("\n", " | "), flush=True)
    if "STOPPING=1" in message:
        break
PY
receiver_pid=$!
for _ in $(seq 100); do grep -q BOUND "$work/notify.log" && break; sleep 0.1; done
export NOTIFY_SOCKET="$work/notify.sock"
"$@" 2>"$work/daemon.log" &
daemon_pid=$!
for _ in $(seq 600); do grep -q 'READY=1' "$work/notify.log" && break; sleep 0.1; done
grep -q 'READY=1' "$work/notify.log" || fail "no READY=1: $(cat "$work/daemon.log")"
port="$(cat "$work/port")"
# deploy.md "Verify"
grep -q '"ready":true' <<<"$(curl -fsS "http://127.0.0.1:$port/api/health/ready")" || fail "ready"
grep -q '"sample1"' <<<"$(curl -fsS "http://127.0.0.1:$port/api/browse/sessions")" || fail "sessions"
grep -q "daemon: running, pid $daemon_pid, http://127.0.0.1:$port" <<<"$("$bin" info)" || fail "info does not list the daemon"
# connect.md "Same host"
url=$("$bin" info --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["daemons"][0]["url"])')
[[ "$url" == "http://127.0.0.1:$port" ]] || fail "info --json gives $url"
[[ -f "$XDG_RUNTIME_DIR/quantem-gpu/server-$daemon_pid.json" ]] || fail "no runtime file"
stopped_pid="$daemon_pid"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || fail "the daemon exited with $? on SIGTERM"
daemon_pid=""
wait "$receiver_pid" || true
receiver_pid=""
grep -q 'STOPPING=1' "$work/notify.log" || fail "no STOPPING=1"
[[ ! -e "$XDG_RUNTIME_DIR/quantem-gpu/server-$stopped_pid.json" ]] || fail "the runtime file outlived the daemon"
unset NOTIFY_SOCKET

# --- the unit listening on the Unix socket only (connect.md "Through SSH, to the Unix socket") ---
socket_path="$XDG_RUNTIME_DIR/quantem-gpu/quantem.sock"
set_env QUANTEM_GPU_LISTEN "--unix-socket $socket_path"
set_env QUANTEM_GPU_OPTIONS "--backend cpu"
load_unit_environment
eval "set -- $exec_start"
"$@" 2>"$work/socket.log" &
daemon_pid=$!
wait_ready_on_socket "$socket_path"
grep -q '"sample1"' <<<"$(curl -fsS --unix-socket "$socket_path" http://localhost/api/browse/sessions)" ||
  fail "the unix socket does not serve: $(cat "$work/socket.log")"
[[ "$(stat -c %a "$socket_path")" == 600 ]] || fail "the socket is not 0600"
grep -q "unix socket $socket_path" <<<"$("$bin" info)" || fail "info does not list the socket"
# connect.md "Same host": curl with the arguments `info --json` gives.
curl_args="$("$bin" info --json | python3 -c 'import json, shlex, sys; print(shlex.join(json.load(sys.stdin)["daemons"][0]["curl_args"]))')"
grep -q '"sample1"' <<<"$(eval "curl -fsS $curl_args/api/browse/sessions")" || fail "curl_args ($curl_args) do not reach the daemon"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || fail "the socket daemon exited with $? on SIGTERM"
daemon_pid=""

# --- token mode (deploy.md section 6, connect.md "Token mode") --------------------------
python3 -c 'import secrets; print(secrets.token_hex(32))' > ~/.config/quantem-gpu/token
chmod 600 ~/.config/quantem-gpu/token
QUANTEM_GPU_TOKEN_FILE="$HOME/.config/quantem-gpu/token" \
  "$bin" serve "$work/data" --backend cpu --auth token --port 0 --port-file "$work/token-port" 2>"$work/token.log" &
daemon_pid=$!
for _ in $(seq 300); do
  [[ -s "$work/token-port" ]] && curl -fsS "http://127.0.0.1:$(cat "$work/token-port")/api/health/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
port="$(cat "$work/token-port")"
TOKEN=$(cat ~/.config/quantem-gpu/token)
grep -q '"sample1"' <<<"$(curl -fsS -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$port/api/browse/sessions")" ||
  fail "token mode: the token was not accepted: $(cat "$work/token.log")"
status="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/api/browse/sessions")"
[[ "$status" == 403 ]] || fail "token mode: no token gave $status"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || fail "the token-mode daemon exited with $? on SIGTERM"
daemon_pid=""

# --- upgrade (deploy.md "Upgrade"): install over a running daemon, restart it ---------
"$bin" serve "$work/data" --backend cpu --port 0 --port-file "$work/upgrade-port" 2>"$work/upgrade.log" &
daemon_pid=$!
for _ in $(seq 300); do [[ -s "$work/upgrade-port" ]] && break; sleep 0.1; done
cmake --install "$build" --prefix "$prefix" >/dev/null || fail "installing over a running daemon failed"
curl -fsS "http://127.0.0.1:$(cat "$work/upgrade-port")/api/health/live" >/dev/null ||
  fail "the running daemon stopped answering during the upgrade"
grep -q "daemon: running, pid $daemon_pid" <<<"$("$bin" info)" || fail "info lost the daemon after the upgrade"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || fail "the daemon exited with $? on SIGTERM after the upgrade"
daemon_pid=""
grep -q '^quantem-gpu ' <<<"$("$bin" version)" || fail "the upgraded binary does not run"

# --- uninstall (deploy.md "Uninstall"): every installed file is in the manifest --------
xargs rm -f -- <"$build/install_manifest.txt"
left="$(find "$prefix" -type f)"
[[ -z "$left" ]] || fail "files left after the uninstall: $left"

echo "test-install: the installed binary, unit, its environment, notify, reload, upgrade and uninstall work ($prefix)"
