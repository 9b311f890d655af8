#!/usr/bin/env bash
# compute-sanitizer memcheck over what session 11 changed on the device: the
# row-order ring pass (ring_sums_gpu_tests), the quad passes and the write
# pass's warp copy (ans_conformance_tests), loads with the first product's
# staging pinned on a thread (cuda_backend_tests), and the fault injection's
# failed loads with the leak check on.
#   bash scripts/device/memcheck-session11.sh
set -uo pipefail
bundle=$(pwd)/.bundle
export LD_LIBRARY_PATH="$bundle/lib" QUANTEM_REAL_DATA_DIR="$bundle/data/real" QUANTEM_GPU_FIXTURES="$bundle/data/fixtures"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
echo "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ)"
# cuda_backend_tests' RunningOutOfDeviceMemory* runs out of device memory on purpose: memcheck
# reports its cudaMalloc failure as 2 API errors, so it runs here without memcheck's API checks.
for check in "ring_sums_gpu_tests *" "ans_conformance_tests *" "cuda_backend_tests -*RunningOutOfDeviceMemory*" "cuda_fault_injection_tests *"; do
  read -r suite filter <<< "$check"
  extra=()
  [ "$suite" = cuda_fault_injection_tests ] && extra=(--leak-check full)
  timeout 250 "$sanitizer" --tool memcheck --error-exitcode 9 "${extra[@]}" "$bundle/$suite" \
    --gtest_filter="$filter" --gtest_brief=1 > "/tmp/memcheck_$suite.log" 2>&1
  echo "memcheck $suite ($filter ${extra[*]}) rc=$? $(grep -E "ERROR SUMMARY|LEAK SUMMARY" "/tmp/memcheck_$suite.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Invalid|out of bounds|tests? from .* ran" "/tmp/memcheck_$suite.log" | head -5
done
