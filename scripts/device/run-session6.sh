#!/usr/bin/env bash
# Session 6 on the GPU machine (issue 10): the GPU suites (seek points and the
# load-time pattern sum included), what fresh vs recycled body memory costs,
# the loopback floor with default and 4 MiB socket buffers, the in-process
# load, and the viewer benchmark against serve --gpus auto. JSON under $OUT.
#   bash scripts/device/run-session6.sh [suites|bench|all]   (default all)
set -uo pipefail
source "$(dirname "$0")/lib.sh"
what=${1:-all}
echo "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ)"
if [ "$what" = all ] || [ "$what" = suites ]; then
  run_gpu_suites ans_reader_host_tests ans_conformance_tests ring_sums_gpu_tests resident_conformance_test \
    cuda_backend_tests cuda_fault_injection_tests
fi
[ "$what" = suites ] && exit 0
if [ "$what" = primitives ]; then
  data=/tmp/qv
  rm -rf "$data" && mkdir -p "$data/tilt0"
  run_bundle "$bin" synth "$data/tilt0" --prefix tilt --scan 512x512 --detector 192x192 --dtype uint16 \
    --preset realistic --threads "$(nproc)" > /dev/null 2>&1
  for k in 512 0; do
    LD_LIBRARY_PATH="$bundle/lib" timeout 150 "$bundle/cuda_backend_bench" "$data/tilt0/tilt_master.h5" --repeats 2 \
      --frames-per-seek-point "$k" --json "$out/primitives_seek$k.json" > /dev/null 2> "$out/primitives_seek$k.log"
    echo "seek $k rc=$? $(python3 -c "import json; print(json.load(open('$out/primitives_seek$k.json'))['request_primitives_ms'])")"
  done
  exit 0
fi
if [ "$what" = all ] || [ "$what" = checks ]; then
  # compute-sanitizer memcheck over the seek points (recorder, segmented masked
  # sum, seek-started frame jobs) and every CUDA resident primitive.
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  export QUANTEM_REAL_DATA_DIR="$bundle/data/real" QUANTEM_GPU_FIXTURES="$bundle/data/fixtures"
  LD_LIBRARY_PATH="$bundle/lib" timeout 120 "$sanitizer" --tool memcheck --error-exitcode 9 \
    "$bundle/ans_conformance_tests" --gtest_filter='*Seek*:*Cuda*' --gtest_brief=1 > "$out/memcheck_ans.log" 2>&1
  echo "memcheck ans_conformance (seek points, CUDA codec) rc=$? $(grep -E "ERROR SUMMARY" "$out/memcheck_ans.log")"
  LD_LIBRARY_PATH="$bundle/lib" timeout 160 "$sanitizer" --tool memcheck --error-exitcode 9 \
    "$bundle/resident_conformance_test" --gtest_filter='ResidentConformance/1.*' --gtest_brief=1 \
    > "$out/memcheck_resident.log" 2>&1
  echo "memcheck resident_conformance (CUDA resident) rc=$? $(grep -E "ERROR SUMMARY" "$out/memcheck_resident.log")"
  grep -E "^\[  FAILED|Invalid|out of bounds" "$out/memcheck_resident.log" "$out/memcheck_ans.log" | head -8
  [ "$what" = checks ] && exit 0
fi
run_bundle "$bundle/bench_host_memory" > "$out/host_memory.json" 2>&1
echo "host memory (µs per 1 MiB body): $(cat "$out/host_memory.json")"
python3 scripts/device/loopback_floor.py 0 147456 1048576 > "$out/loopback_floor.json"
QUANTEM_FLOOR_SOCKET_BUFFER=4194304 python3 scripts/device/loopback_floor.py 0 147456 1048576 \
  > "$out/loopback_floor_4mib.json"
echo "loopback floor, default buffers: $(cat "$out/loopback_floor.json")"
echo "loopback floor, 4 MiB buffers:   $(cat "$out/loopback_floor_4mib.json")"
data=/tmp/qv
rm -rf "$data" && mkdir -p "$data/tilt0"
start=$(date +%s)
run_bundle "$bin" synth "$data/tilt0" --prefix tilt --scan 512x512 --detector 192x192 --dtype uint16 \
  --preset realistic --threads "$(nproc)" > /dev/null 2>&1
echo "synth rc=$? ($(( $(date +%s) - start )) s)"
cat "$data"/tilt0/* > /dev/null
if [ -x "$bundle/cuda_backend_bench" ]; then
  # The in-process load and request primitives with seek points every 512
  # frames (the default), every 256, and none.
  for k in ${QUANTEM_SEEK_VARIANTS:-512 0}; do
    LD_LIBRARY_PATH="$bundle/lib" timeout 150 "$bundle/cuda_backend_bench" "$data/tilt0/tilt_master.h5" --repeats 5 \
      --frames-per-seek-point "$k" --json "$out/load_u16_512_seek$k.json" > /dev/null 2> "$out/load_u16_512_seek$k.log"
    echo "cuda_backend_bench seek $k rc=$?"
    python3 - "$out/load_u16_512_seek$k.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["stage_split_of_median_run"]
print("  load %.3f s (encode gpu %.3f, decode gpu %.3f) resident %.3f GB (%.3f of stored) | %s" % (
    r["load_seconds_median"], s["encode_seconds_gpu"], s["decode_seconds_gpu"], r["resident_bytes"] / 1e9,
    r["resident_over_stored"], json.dumps(r["request_primitives_ms"])))
PY
  done
fi
if [ "${QUANTEM_NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
  # Kernel durations of the request primitives (the BF masked sum narrowed to
  # uint32, a frame at a new position), after the warm-up's launches.
  LD_LIBRARY_PATH="$bundle/lib" timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum \
    --kernel-name regex:'masked_sum_kernel|add_ring_sums|narrow_plan|accumulate_frames' --launch-skip 56 \
    --launch-count 75 --csv "$bundle/cuda_backend_bench" "$data/tilt0/tilt_master.h5" --repeats 1 \
    > "$out/ncu_request_kernels.csv" 2> "$out/ncu.log"
  echo "ncu rc=$?"
  python3 - "$out/ncu_request_kernels.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    head = rows[0]
    k, v, u = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
    import collections, statistics
    by = collections.defaultdict(list)
    for r in rows[1:]:
        if r[k] != "Kernel Name":
            by[r[k].split("(")[0][-40:]].append(float(r[v].replace(",", "")))
    for name, values in by.items():
        print("  %-40s n=%d median %.1f %s" % (name, len(values), statistics.median(values), head and rows[1][u]))
PY
fi
for i in 1 2; do
  start=$EPOCHREALTIME
  run_bundle "$bin" info > /dev/null 2>&1
  echo "quantem-gpu info: $(python3 -c "print(round($EPOCHREALTIME - $start, 3))") s"
done
extra=()
if run_bundle "$bundle/bench_http_viewer" --help 2>&1 | grep -q fill-image-cache; then
  extra=(--fill-image-cache 64)
fi
LD_LIBRARY_PATH="$bundle/lib" timeout 240 "$bundle/bench_http_viewer" \
  --start-daemon "$bin" --data "$data" --session tilt0 --file tilt_master.h5 \
  --daemon-arg=--gpus --daemon-arg=auto --cold-starts "${QUANTEM_COLD_STARTS:-2}" --requests 40 "${extra[@]}" \
  > "$out/http.json" 2> "$out/http.log"
echo "== bench_http_viewer rc=$?"
python3 scripts/device/request_path_table.py "$out/http.json" "" "$out/loopback_floor.json" 2>&1 | tee "$out/table.md"
python3 scripts/device/summarise_http.py "$out/http.json"
