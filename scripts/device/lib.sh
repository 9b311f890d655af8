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

# The load alone (cuda_backend_bench --load-only 1, median of 5 after a first
# load) for each "name=flags" entry of $2 (';'-separated), on master $1: one
# line each with every load's seconds and its frame-index seconds.
# QUANTEM_BENCH_BIN: another benchmark binary of the bundle (e.g. a baseline build).
run_load_variants() {
  local master=$1 variants variant name flags
  IFS=';' read -r -a variants <<< "$2"
  for variant in "${variants[@]}"; do
    name=${variant%%=*}
    read -r -a flags <<< "${variant#*=}"
    LD_LIBRARY_PATH="$bundle/lib" timeout 120 "$bundle/${QUANTEM_BENCH_BIN:-cuda_backend_bench}" "$master" --repeats 5 --load-only 1 \
      "${flags[@]}" > "$out/load_$name.json" 2> "$out/load_$name.log"
    echo "load $name (${flags[*]}) rc=$?: $(grep -ho 'GPU 0: [0-9.]* s (frame index [0-9.]*' "$out/load_$name.json" \
      "$out/load_$name.log" | tail -n +2 | awk '{printf "%s/%s ", $3, $7}')$(tail -1 "$out/load_$name.json" | grep -o '"load_seconds_median":[0-9.]*')"
  done
}

# The GPU suites every session's script runs.
run_all_gpu_suites() {
  run_gpu_suites bitshuffle_lz4_gpu_tests resident_conformance_test ans_conformance_tests cuda_backend_tests \
    ring_sums_gpu_tests cuda_fault_injection_tests
}
