#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over the bundle made by
# scripts/device/build-bundle.sh (carried as .bundle):
#   A. issue 13 item 3: device allocation failure mid-load
#      (tests/gpu/cuda_fault_injection_test.cpp: every allocation of a load
#      failed in turn, directly and through the residency manager), then the
#      same suite's manager case under compute-sanitizer memcheck, and the CUDA
#      backend's own suite (the hook must not change a load);
#   B. issue 10 item 7: the dense peers of the request benchmark's products
#      (tests/bench/bench_dense_peers.cu) on a 512x512x192x192 u16 volume
#      generated on the device: $OUT/dense_peers.json.
# Results: $OUT/summary.txt, $OUT/fault_injection.log, $OUT/dense_peers.json (+ .log).
#
#   bash scripts/device/run-session5.sh [all|fault|dense]
#
# A small bundle for it (about 20 MB):
#   QUANTEM_BUNDLE_TARGETS="cuda_fault_injection_tests cuda_backend_tests bench_dense_peers" \
#     scripts/device/build-bundle.sh
# (mode fault needs only the first two).
set -uo pipefail
bundle=$(pwd)/.bundle
out=${OUT:-/tmp/quantem-device-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export QUANTEM_REAL_DATA_DIR="$bundle/data/real"
export QUANTEM_GPU_FIXTURES="$bundle/data/fixtures"
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
mode=${1:-all}

note "commit $(cat "$bundle/COMMIT" 2>/dev/null) date $(date -u +%FT%TZ) threads $(nproc) mode $mode"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee -a "$summary"

run_test() {  # name timeout log args...
  local name=$1 limit=$2 log=$3
  shift 3
  local start=$(date +%s)
  timeout "$limit" "$@" > "$log.one" 2>&1
  local rc=$?
  cat "$log.one" >> "$log"
  note "$name rc=$rc ($(( $(date +%s) - start )) s): $(grep -E "tests? from .* ran|^\[  (PASSED|SKIPPED|FAILED) " "$log.one" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is|: error|device allocations|largest cudaMemGetInfo" "$log.one" | head -30 | tee -a "$summary"
  rm -f "$log.one"
}

if [ "$mode" = all ] || [ "$mode" = fault ]; then
  log="$out/fault_injection.log"
  : > "$log"
  run_test cuda_fault_injection_tests 240 "$log" "$bundle/cuda_fault_injection_tests"
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ "${QUANTEM_SKIP_MEMCHECK:-0}" = 1 ]; then
    note "memcheck skipped (QUANTEM_SKIP_MEMCHECK=1)"
  elif [ -x "$sanitizer" ]; then
    run_test "memcheck cuda_fault_injection_tests (manager case)" 240 "$log" \
      "$sanitizer" --tool memcheck --error-exitcode 9 --leak-check full "$bundle/cuda_fault_injection_tests" \
      --gtest_filter='*ResidencyManager*'
    grep -E "ERROR SUMMARY|Invalid|out of bounds|Leaked" "$log" | sort | uniq -c | head -10 | tee -a "$summary"
  else
    note "compute-sanitizer not found"
  fi
  run_test cuda_backend_tests 200 "$log" "$bundle/cuda_backend_tests" --gtest_brief=1
fi

if [ "$mode" = all ] || [ "$mode" = dense ]; then
  start=$(date +%s)
  timeout 300 "$bundle/bench_dense_peers" --json "$out/dense_peers.json" --repeats "${QUANTEM_DENSE_REPEATS:-15}" > "$out/dense_peers.log" 2>&1
  note "bench_dense_peers rc=$? ($(( $(date +%s) - start )) s)"
  tail -n 30 "$out/dense_peers.log" | tee -a "$summary"
fi
nvidia-smi --query-gpu=memory.used --format=csv,noheader | tee -a "$summary"
