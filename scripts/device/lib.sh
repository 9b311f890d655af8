#!/usr/bin/env bash
# Shared steps of the scripts/device/run-*.sh scripts (sourced, not run):
# the bundle's paths, the GPU suites, the synth acquisition every benchmark uses.
bundle=$(pwd)/.bundle
out=${OUT:-/tmp/quantem-device-out}
mkdir -p "$out"
bin="$bundle/quantem-gpu"
run_bundle() { LD_LIBRARY_PATH="$bundle/lib" "$@"; }

# Runs each named GPU suite that the bundle holds; one line each, failures after it.
run_gpu_suites() {
  for suite in "$@"; do
    [ -x "$bundle/$suite" ] || continue
    QUANTEM_REAL_DATA_DIR="$bundle/data/real" QUANTEM_GPU_FIXTURES="$bundle/data/fixtures" \
      LD_LIBRARY_PATH="$bundle/lib" timeout 240 "$bundle/$suite" --gtest_brief=1 > "$out/$suite.log" 2>&1
    echo "$suite rc=$? $(grep -E "tests? from .* ran|^\[  (PASSED|FAILED) " "$out/$suite.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED|Failure|Expected|Which is|error" "$out/$suite.log" | head -12
  done
}

# The realistic 512x512x192x192 u16 acquisition at $1/tilt0 (written once per
# machine), then read once so the page cache is warm.
synth_realistic_512() {
  local data=$1
  if [ ! -f "$data/tilt0/tilt_master.h5" ]; then
    rm -rf "$data" && mkdir -p "$data/tilt0"
    local start
    start=$(date +%s)
    run_bundle "$bin" synth "$data/tilt0" --prefix tilt --scan 512x512 --detector 192x192 --dtype uint16 \
      --preset realistic --threads "$(nproc)" > /dev/null 2>&1
    echo "synth rc=$? ($(( $(date +%s) - start )) s)"
  fi
  cat "$data"/tilt0/* > /dev/null
}
