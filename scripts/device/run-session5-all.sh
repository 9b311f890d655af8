#!/usr/bin/env bash
# One device call for session 5: the request path through HTTP with the GPU
# suites first (diag-request-path.sh, glibc's default malloc only), then the
# allocation-failure fault tests and the dense peers (run-session5.sh).
#   bash scripts/device/run-session5-all.sh
set -uo pipefail
out=${OUT:-/tmp/quantem-device-out}
mkdir -p "$out/request-path" "$out/session5"
OUT="$out/request-path" QUANTEM_DIAG_VARIANTS=default timeout 240 bash scripts/device/diag-request-path.sh 2>&1 | tee "$out/request-path.txt"
OUT="$out/session5" QUANTEM_SKIP_MEMCHECK=${QUANTEM_SKIP_MEMCHECK:-1} QUANTEM_DENSE_REPEATS=${QUANTEM_DENSE_REPEATS:-9} \
  timeout 300 bash scripts/device/run-session5.sh all 2>&1 | tail -60
