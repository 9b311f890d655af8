#!/usr/bin/env bash
# Diagnostics of the request path on the GPU machine (issue 10): the viewer
# benchmark against serve --gpus auto with glibc's default malloc and with
# large-buffer reuse (mmap threshold 32 MB, trim threshold 1 GB), and the
# loopback floor of moving a body of the same size. JSON under $OUT.
#   bash scripts/device/diag-request-path.sh
set -uo pipefail
source "$(dirname "$0")/lib.sh"
echo "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ)"
# The GPU suites the bundle carries, first (QUANTEM_DIAG_TESTS=0 skips them).
if [ "${QUANTEM_DIAG_TESTS:-1}" = 1 ]; then
  run_gpu_suites ring_sums_gpu_tests resident_conformance_test cuda_backend_tests
fi
data=/tmp/qv
rm -rf "$data" && mkdir -p "$data/tilt0"
start=$(date +%s)
run_bundle "$bin" synth "$data/tilt0" --prefix tilt --scan 512x512 --detector 192x192 --dtype uint16 \
  --preset realistic --threads "$(nproc)" > /dev/null 2>&1
echo "synth rc=$? ($(( $(date +%s) - start )) s)"
cat "$data"/tilt0/* > /dev/null
python3 scripts/device/loopback_floor.py 0 147456 1048576 > "$out/loopback_floor.json"
# The cold-start floor: a process that only initialises CUDA and lists the GPUs.
for i in 1 2 3; do
  start=$EPOCHREALTIME
  run_bundle "$bin" info > /dev/null 2>&1
  echo "quantem-gpu info (process start + CUDA initialisation): $(python3 -c "print(round($EPOCHREALTIME - $start, 3))") s"
done
echo "loopback floor: $(cat "$out/loopback_floor.json")"
summarise() { python3 scripts/device/summarise_http.py "$1"; }
# QUANTEM_DIAG_VARIANTS: "default reuse" (default) or a subset.
for variant in ${QUANTEM_DIAG_VARIANTS:-default reuse}; do
  tunables=""
  [ "$variant" = reuse ] && tunables="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
  GLIBC_TUNABLES=$tunables LD_LIBRARY_PATH="$bundle/lib" timeout 200 "$bundle/bench_http_viewer" \
    --start-daemon "$bin" --data "$data" --session tilt0 --file tilt_master.h5 \
    --daemon-arg=--gpus --daemon-arg=auto --cold-starts "${QUANTEM_DIAG_COLD_STARTS:-1}" --requests 40 > "$out/http_$variant.json" 2> "$out/http_$variant.log"
  echo "== $variant rc=$?"
  summarise "$out/http_$variant.json"
done
