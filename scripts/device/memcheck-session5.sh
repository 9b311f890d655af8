#!/usr/bin/env bash
# compute-sanitizer memcheck over what session 5 added on the device: the
# allocation-failure hook's failed loads (through the residency manager, leak
# check on) and every CUDA resident primitive of the conformance suite (the
# device narrowing of masked sums, the frame-moments table, pinned staging).
#   bash scripts/device/memcheck-session5.sh
set -uo pipefail
bundle=$(pwd)/.bundle
export LD_LIBRARY_PATH="$bundle/lib" QUANTEM_REAL_DATA_DIR="$bundle/data/real" QUANTEM_GPU_FIXTURES="$bundle/data/fixtures"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
echo "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ)"
timeout 130 "$sanitizer" --tool memcheck --error-exitcode 9 --leak-check full "$bundle/cuda_fault_injection_tests" \
  --gtest_filter='*ResidencyManager*' --gtest_brief=1 > /tmp/memcheck_fault.log 2>&1
echo "memcheck cuda_fault_injection_tests (manager case, leak check) rc=$?"
grep -E "ERROR SUMMARY|LEAK SUMMARY|tests? from .* ran|PASSED|FAILED" /tmp/memcheck_fault.log | head -5
timeout 140 "$sanitizer" --tool memcheck --error-exitcode 9 "$bundle/resident_conformance_test" \
  --gtest_filter='ResidentConformance/1.*' --gtest_brief=1 > /tmp/memcheck_conformance.log 2>&1
echo "memcheck resident_conformance (CUDA resident, every primitive) rc=$?"
grep -E "ERROR SUMMARY|tests? from .* ran|PASSED|FAILED" /tmp/memcheck_conformance.log | head -5
