#!/usr/bin/env bash
# compute-sanitizer memcheck over what session 10 changed on the device: the
# batched-literal replay of the bitshuffle/LZ4 decode (the default), and loads
# through registered huge-page staging (cuda_backend_tests, the fault
# injection's failed loads with the leak check on).
#   bash scripts/device/memcheck-session10.sh
set -uo pipefail
bundle=$(pwd)/.bundle
export LD_LIBRARY_PATH="$bundle/lib" QUANTEM_REAL_DATA_DIR="$bundle/data/real" QUANTEM_GPU_FIXTURES="$bundle/data/fixtures"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
echo "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ)"
# cuda_backend_tests' RunningOutOfDeviceMemory* runs out of device memory on purpose: memcheck
# reports its cudaMalloc failure as 2 API errors, so it runs here without memcheck's API checks.
# QUANTEM_MEMCHECK_CHECKS: "suite filter" entries separated by ';' (memcheck-session11.sh sets its own).
IFS=';' read -r -a checks <<< "${QUANTEM_MEMCHECK_CHECKS:-bitshuffle_lz4_gpu_tests *;cuda_backend_tests -*RunningOutOfDeviceMemory*;cuda_fault_injection_tests *}"
for check in "${checks[@]}"; do
  read -r suite filter <<< "$check"
  extra=()
  [ "$suite" = cuda_fault_injection_tests ] && extra=(--leak-check full)
  timeout 250 "$sanitizer" --tool memcheck --error-exitcode 9 "${extra[@]}" "$bundle/$suite" \
    --gtest_filter="$filter" --gtest_brief=1 > "/tmp/memcheck_$suite.log" 2>&1
  echo "memcheck $suite ($filter ${extra[*]}) rc=$? $(grep -E "ERROR SUMMARY|LEAK SUMMARY" "/tmp/memcheck_$suite.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Invalid|out of bounds|tests? from .* ran" "/tmp/memcheck_$suite.log" | head -5
done
