#!/usr/bin/env bash
# Runs on the GPU machine over the bundle (plus .bundle/tools/wrk carried from
# Debian with its libraries in .bundle/lib): every GPU suite, sanitizer and the
# serve --gpus auto vs --backend cpu comparison (run-backend.sh quick), then
# wrk with 64 connections for 60 s over the viewer's mixed routes against
# serve --gpus auto (scripts/bench-wrk.sh).
set -uo pipefail
bundle=$(pwd)/.bundle
out=${OUT:-/tmp/quantem-device-out}
mkdir -p "$out/backend"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ "${1:-}" = "wrk-only" ] || OUT="$out/backend" timeout 300 bash scripts/device/run-backend.sh quick > /dev/null 2>&1
echo "run-backend.sh quick rc=$?"
grep -E "^test |mismatches|ERROR SUMMARY|FAILED" "$out/backend/summary.txt"
cp "$out/backend/summary.txt" "$out/summary_backend.txt"
tar -C "$out" -czf "$out/backend.tar.gz" backend && rm -rf "$out/backend"
# The bundle's libraries only for the bundle's programs: the machine's curl needs its own libcurl.
unset LD_LIBRARY_PATH
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/quantem-gpu "$@"\n' "$bundle" "$bundle" > /tmp/quantem-gpu-run
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/tools/wrk "$@"\n' "$bundle" "$bundle" > /tmp/wrk-run
chmod +x /tmp/quantem-gpu-run /tmp/wrk-run
QUANTEM_BIN=/tmp/quantem-gpu-run WRK=/tmp/wrk-run timeout 200 bash scripts/bench-wrk.sh unused 60 -- --gpus auto \
  | tee "$out/wrk_gpu.json"
echo "bench-wrk rc=${PIPESTATUS[0]}"
