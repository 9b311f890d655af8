#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over the bundle made by
# scripts/device/build-bundle.sh (carried as .bundle): the CUDA backend's
# tests, the resident conformance suite (CPU and CUDA residents), the codec GPU
# suites, compute-sanitizer memcheck on small loads and products, an
# end-to-end comparison of `serve --gpus auto` with `serve --backend cpu` on
# synthesized u16 and u32 acquisitions, then (mode bench) the load benchmark
# on a 512x512x192x192 u16 acquisition and a u32 one, or (mode large) the test
# counts and a 1024x1024x192x192 u16 load. Results go to $OUT.
#
#   bash scripts/device/run-backend.sh [quick|bench|large]
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
threads=$(nproc)

note "commit $(cat "$bundle/COMMIT" 2>/dev/null) date $(date -u +%FT%TZ) threads $threads"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$summary"

run_test() {  # name timeout args...
  local name=$1 limit=$2
  shift 2
  local start=$(date +%s)
  timeout "$limit" "$@" --gtest_brief=1 > "$out/one_test.log" 2>&1
  local rc=$?
  cat "$out/one_test.log" >> "$out/tests.log"
  note "test $name rc=$rc ($(( $(date +%s) - start )) s): $(grep -E "tests? from .* ran|^\[  (PASSED|SKIPPED|FAILED) " "$out/one_test.log" | tr '\n' ' ')"
  rm -f "$out/one_test.log"
}
run_test cuda_backend_tests 150 "$bundle/cuda_backend_tests"
run_test resident_conformance_test 120 "$bundle/resident_conformance_test"
QUANTEM_DEBUG_SYNC=1 run_test "resident_conformance_test(cuda,QUANTEM_DEBUG_SYNC=1)" 90 \
  "$bundle/resident_conformance_test" --gtest_filter='ResidentConformance/1.*'
run_test ans_conformance_tests 60 "$bundle/ans_conformance_tests"
run_test bitshuffle_lz4_gpu_tests 60 "$bundle/bitshuffle_lz4_gpu_tests"
run_test ring_sums_gpu_tests 60 "$bundle/ring_sums_gpu_tests"
grep -E "^\[  FAILED|Failure|Expected|Which is|peak:" "$out/tests.log" | head -40 | tee -a "$summary"

if [ "${1:-}" != "large" ]; then
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$sanitizer" ]; then
  timeout 100 "$sanitizer" --tool memcheck --error-exitcode 9 "$bundle/cuda_backend_tests" \
    --gtest_filter='*RealArina*:*Refuses*' --gtest_brief=1 > "$out/sanitizer.log" 2>&1
  note "memcheck cuda_backend_tests (real Arina load + products) rc=$?"
  timeout 100 "$sanitizer" --tool memcheck --error-exitcode 9 "$bundle/resident_conformance_test" \
    --gtest_filter='ResidentConformance/1.MaskedPixels*:ResidentConformance/1.Rejects*:ResidentConformance/1.Concurrent*' \
    --gtest_brief=1 >> "$out/sanitizer.log" 2>&1
  note "memcheck resident_conformance (CUDA resident products) rc=$?"
  grep -E "ERROR SUMMARY|Invalid|out of bounds" "$out/sanitizer.log" | sort | uniq -c | head -10 | tee -a "$summary"
else
  note "compute-sanitizer not found"
fi

# End to end: the same requests to a CUDA daemon and a CPU daemon over the same folder.
data=/tmp/quantem-e2e
rm -rf "$data"
mkdir -p "$data/real16" "$data/dense32"
"$bundle/quantem-gpu" synth "$data/real16" --prefix real16 --scan 32x32 --detector 192x192 --dtype uint16 \
  --preset realistic --frames-per-shard 300 > /dev/null
"$bundle/quantem-gpu" synth "$data/dense32" --prefix dense32 --scan 32x32 --detector 192x192 --dtype uint32 \
  --preset dense > /dev/null
"$bundle/quantem-gpu" serve "$data" --gpus auto --port 0 --port-file "$data/gpu.port" > "$out/serve_gpu.log" 2>&1 &
gpu_pid=$!
"$bundle/quantem-gpu" serve "$data" --backend cpu --port 0 --port-file "$data/cpu.port" > "$out/serve_cpu.log" 2>&1 &
cpu_pid=$!
for i in $(seq 1 300); do [ -s "$data/gpu.port" ] && [ -s "$data/cpu.port" ] && break; sleep 0.1; done
if [ -s "$data/gpu.port" ] && [ -s "$data/cpu.port" ]; then
  timeout 90 python3 scripts/device/e2e_compare.py "http://127.0.0.1:$(cat "$data/gpu.port")" \
    "http://127.0.0.1:$(cat "$data/cpu.port")" real16,dense32 --json "$out/e2e.json" > "$out/e2e.log" 2>&1
  note "e2e serve --gpus auto vs --backend cpu rc=$?"
  grep -E "MISMATCH|backend|mismatches|real16 gpu|dense32 gpu" "$out/e2e.log" | head -20 | tee -a "$summary"
else
  note "e2e: a daemon did not start"; tail -5 "$out/serve_gpu.log" "$out/serve_cpu.log" | tee -a "$summary"
fi
kill "$gpu_pid" "$cpu_pid" 2>/dev/null
wait "$gpu_pid" "$cpu_pid" 2>/dev/null
# Start-up refusal: a device index that does not exist.
"$bundle/quantem-gpu" serve "$data" --gpu 7 --port 0 --port-file "$data/bad.port" > "$out/refusal.txt" 2>&1
note "serve --gpu 7 rc=$? $(head -c 200 "$out/refusal.txt")"

fi  # not large

if [ "${1:-}" = "large" ]; then
  # A 1024x1024x192x192 u16 scan (77 GB dense) loaded on one GPU.
  bench=/tmp/quantem-bench
  rm -rf "$bench" && mkdir -p "$bench/u16"
  start=$(date +%s)
  "$bundle/quantem-gpu" synth "$bench/u16" --prefix large16 --scan 1024x1024 --detector 192x192 --dtype uint16 \
    --preset realistic --threads "$threads" > /dev/null 2>&1
  note "synth 1024x1024x192x192 u16 rc=$? ($(( $(date +%s) - start )) s)"
  timeout 150 "$bundle/cuda_backend_bench" "$bench/u16/large16_master.h5" --repeats 1 \
    --json "$out/bench_load_u16_1024.json" > /dev/null 2>> "$out/tests.log"
  note "bench load u16 1024x1024 rc=$?"
  set -- bench-summary
fi

if [ "${1:-}" = "bench" ]; then
  bench=/tmp/quantem-bench
  rm -rf "$bench" && mkdir -p "$bench/u16" "$bench/u32"
  start=$(date +%s)
  "$bundle/quantem-gpu" synth "$bench/u16" --prefix bench16 --scan 512x512 --detector 192x192 --dtype uint16 \
    --preset realistic --threads "$threads" > "$out/synth_u16.txt" 2>&1
  note "synth 512x512x192x192 u16 rc=$? ($(( $(date +%s) - start )) s)"
  timeout 120 "$bundle/cuda_backend_bench" "$bench/u16/bench16_master.h5" --repeats 5 \
    --json "$out/bench_load_u16_512.json" > /dev/null 2>> "$out/tests.log"
  note "bench load u16 512x512 rc=$?"
  rm -rf "$bench/u16"
  "$bundle/quantem-gpu" synth "$bench/u32" --prefix bench32 --scan 128x512 --detector 192x192 --dtype uint32 \
    --preset dense --threads "$threads" > "$out/synth_u32.txt" 2>&1
  note "synth 128x512x192x192 u32 dense rc=$?"
  timeout 120 "$bundle/cuda_backend_bench" "$bench/u32/bench32_master.h5" --repeats 5 \
    --json "$out/bench_load_u32_128x512.json" > /dev/null 2>> "$out/tests.log"
  note "bench load u32 128x512 rc=$?"
fi
if [ "${1:-}" = "bench" ] || [ "${1:-}" = "bench-summary" ]; then
  for f in "$out"/bench_load_*.json; do
    [ -f "$f" ] || continue
    python3 - "$f" <<'PY' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1]))
s = r["stage_split_of_median_run"]
print(sys.argv[1].split("/")[-1], "load median %.3f s" % r["load_seconds_median"], r["load_seconds"],
      "| index %.3f read %.3f wait %.3f h2d %.3f decode %.3f encode %.3f" % (s["index_seconds"], s["read_seconds_host"],
      s["wait_for_gpu_seconds_host"], s["h2d_seconds_gpu"], s["decode_seconds_gpu"], s["encode_seconds_gpu"]),
      "| decode %.0f GB/s" % r["decode_GBps"], "| resident/stored %.3f" % r["resident_over_stored"],
      "| peak admitted %d allocated %d measured %d" % (r["admitted_peak_bytes"], r["allocated_peak_bytes"],
      r["measured_peak_bytes_cudaMemGetInfo"]), "| BF %.2f ms" % r["bf_masked_sum"]["ms_median_host_inclusive"],
      "| CoM %.1f ms" % r["center_of_mass_sums_ms_median"], r["encoding"])
PY
  done
fi
