#!/usr/bin/env bash
# compute-sanitizer memcheck over what session 11 changed on the device: the
# row-order ring pass (ring_sums_gpu_tests), the quad passes and the write
# pass's warp copy (ans_conformance_tests), loads with the first product's
# staging pinned on a thread (cuda_backend_tests), and the fault injection's
# failed loads with the leak check on (memcheck-session10.sh's steps).
#   bash scripts/device/memcheck-session11.sh
QUANTEM_MEMCHECK_CHECKS="ring_sums_gpu_tests *;ans_conformance_tests *;cuda_backend_tests -*RunningOutOfDeviceMemory*;cuda_fault_injection_tests *" \
  exec bash "$(dirname "$0")/memcheck-session10.sh"
