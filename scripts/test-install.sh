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

# --- start it as systemd would ------------------------------------------------------
"$bin" synth "$work/data/sample1" --scan 8x8 --detector 16x16 --threads 2 >/dev/null
env_file="$HOME/.config/quantem-gpu/quantem-gpu.env"
sed -i -e "s|^QUANTEM_GPU_DATA_FOLDER=.*|QUANTEM_GPU_DATA_FOLDER=$work/data|" \
  -e "s|^QUANTEM_GPU_LISTEN=.*|QUANTEM_GPU_LISTEN=--port 0|" \
  -e "s|^QUANTEM_GPU_OPTIONS=.*|QUANTEM_GPU_OPTIONS=--backend cpu --port-file $work/port|" "$env_file"
# EnvironmentFile= lines are KEY=VALUE, taken literally.
while IFS= read -r line; do
  [[ "$line" =~ ^([A-Z_][A-Z0-9_]*)=(.*)$ ]] && export "${BASH_REMATCH[1]}=${BASH_REMATCH[2]}"
done <"$env_file"
exec_start="$(sed -n 's/^ExecStart=//p' "$HOME/.config/systemd/user/quantem-gpu.service")"
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
export XDG_RUNTIME_DIR="$work/xdg" NOTIFY_SOCKET="$work/notify.sock"
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
sed -i -e "s|^QUANTEM_GPU_LISTEN=.*|QUANTEM_GPU_LISTEN=--unix-socket $socket_path|" \
  -e "s|^QUANTEM_GPU_OPTIONS=.*|QUANTEM_GPU_OPTIONS=--backend cpu|" "$env_file"
while IFS= read -r line; do
  [[ "$line" =~ ^([A-Z_][A-Z0-9_]*)=(.*)$ ]] && export "${BASH_REMATCH[1]}=${BASH_REMATCH[2]}"
done <"$env_file"
eval "set -- $exec_start"
"$@" 2>"$work/socket.log" &
daemon_pid=$!
for _ in $(seq 300); do
  curl -fsS --unix-socket "$socket_path" http://localhost/api/health/ready >/dev/null 2>&1 && break
  sleep 0.1
done
grep -q '"sample1"' <<<"$(curl -fsS --unix-socket "$socket_path" http://localhost/api/browse/sessions)" ||
  fail "the unix socket does not serve: $(cat "$work/socket.log")"
[[ "$(stat -c %a "$socket_path")" == 600 ]] || fail "the socket is not 0600"
grep -q "unix socket $socket_path" <<<"$("$bin" info)" || fail "info does not list the socket"
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

echo "test-install: the installed binary, unit and notify protocol work ($prefix)"
