#!/usr/bin/env bash
# Session 7 on the GPU machine (issue 10): the viewer benchmark against
# `serve --gpus auto` with the HTTP threads' busy-wait window on (the default)
# and off, the request primitives in-process, the GPU suites. JSON under $OUT.
#   bash scripts/device/run-session7.sh [http|primitives|suites|checks|all]   (default http)
# QUANTEM_SPIN_VARIANTS: --http-spin-us values to compare (default "1000 0").
set -uo pipefail
source "$(dirname "$0")/lib.sh"
what=${1:-http}
echo "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ) cpuidle $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null)/$(cat /sys/devices/system/cpu/cpuidle/current_governor_ro 2>/dev/null || cat /sys/devices/system/cpu/cpuidle/current_governor 2>/dev/null) haltpoll_ns $(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns 2>/dev/null)"
if [ "$what" = all ] || [ "$what" = suites ]; then
  run_gpu_suites ans_reader_host_tests ans_conformance_tests ring_sums_gpu_tests resident_conformance_test \
    cuda_backend_tests cuda_fault_injection_tests
  [ "$what" = suites ] && exit 0
fi
if [ "$what" = checks ]; then
  # compute-sanitizer memcheck over the decoders' prologue (decode tables copied
  # from the load's or built per CTA), both CTA widths, every CUDA resident primitive.
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  export QUANTEM_REAL_DATA_DIR="$bundle/data/real" QUANTEM_GPU_FIXTURES="$bundle/data/fixtures"
  for check in "ans_conformance_tests *" "resident_conformance_test ResidentConformance/1.*" \
               "cuda_backend_tests *FramesAndRegionsAgreeAtEveryCtaWidth*"; do
    read -r suite filter <<< "$check"
    LD_LIBRARY_PATH="$bundle/lib" timeout 200 "$sanitizer" --tool memcheck --error-exitcode 9 "$bundle/$suite" \
      --gtest_filter="$filter" --gtest_brief=1 > "$out/memcheck_$suite.log" 2>&1
    echo "memcheck $suite ($filter) rc=$? $(grep -E "ERROR SUMMARY" "$out/memcheck_$suite.log")"
    grep -E "^\[  FAILED|Invalid|out of bounds" "$out/memcheck_$suite.log" | head -5
  done
  exit 0
fi
data=/tmp/qv
synth_realistic_512 "$data"
if [ "$what" = all ] || [ "$what" = primitives ]; then
  # QUANTEM_ACCUMULATE_VARIANTS: CTA widths of the frame/region decoder to compare (0: the per-call rule).
  for width in ${QUANTEM_ACCUMULATE_VARIANTS:-0}; do
    for seek in ${QUANTEM_SEEK_VARIANTS:-512}; do
      for tables in ${QUANTEM_TABLE_VARIANTS:-1}; do
        name=w${width}_seek${seek}_tables$tables
        LD_LIBRARY_PATH="$bundle/lib" timeout 150 "$bundle/cuda_backend_bench" "$data/tilt0/tilt_master.h5" --repeats 3 \
          --accumulate-threads "$width" --frames-per-seek-point "$seek" --decode-tables-at-load "$tables" \
          --json "$out/primitives_$name.json" > /dev/null 2> "$out/primitives_$name.log"
        echo "primitives (CTA width $width, seek points every $seek, decode tables at load $tables) rc=$? $(python3 -c "import json; r=json.load(open('$out/primitives_$name.json')); print(r['load_seconds_median'], r['resident_bytes'], json.dumps(r['request_primitives_ms']))")"
      done
    done
  done
  if [ "${QUANTEM_NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
    # Kernel durations of the request primitives by kernel and grid (a frame's
    # accumulate_frames has one job row, a half crop's hundreds).
    LD_LIBRARY_PATH="$bundle/lib" timeout 240 ncu --clock-control none --print-units base --metrics gpu__time_duration.sum,launch__grid_size \
      --kernel-name regex:'masked_sum_kernel|add_ring_sums|narrow_plan|accumulate_frames' --launch-count 600 --csv \
      "$bundle/cuda_backend_bench" "$data/tilt0/tilt_master.h5" --repeats 1 > "$out/ncu.csv" 2> "$out/ncu.log"
    echo "ncu rc=$?"
    python3 - "$out/ncu.csv" <<'PY'
import csv, collections, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if rows:
    head = rows[0]
    i_id, k, m, v = head.index("ID"), head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    launches = collections.defaultdict(dict)
    for r in rows[1:]:
        if r[k] == "Kernel Name":
            continue
        launches[r[i_id]]["name"] = r[k].split("(")[0].split("<")[0][-30:]
        launches[r[i_id]][r[m]] = float(r[v].replace(",", ""))
    by = collections.defaultdict(list)
    for l in launches.values():
        by[(l["name"], int(l.get("launch__grid_size", 0)))].append(l.get("gpu__time_duration.sum", 0) / 1000.0)
    for (name, grid), us in sorted(by.items()):
        print("  %-30s grid %7d n=%4d median %.1f us" % (name, grid, len(us), statistics.median(us)))
PY
  fi
  [ "$what" = primitives ] && exit 0
fi
python3 scripts/device/loopback_floor.py 0 147456 1048576 > "$out/loopback_floor.json"
echo "loopback floor: $(cat "$out/loopback_floor.json")"
for spin in ${QUANTEM_SPIN_VARIANTS:-1000 0}; do
  extra=()
  run_bundle "$bin" serve --help 2>&1 | grep -q http-spin-us && extra=(--daemon-arg=--http-spin-us="$spin")
  LD_LIBRARY_PATH="$bundle/lib" timeout 240 "$bundle/bench_http_viewer" \
    --start-daemon "$bin" --data "$data" --session tilt0 --file tilt_master.h5 \
    --daemon-arg=--gpus --daemon-arg=auto "${extra[@]}" --cold-starts "${QUANTEM_COLD_STARTS:-2}" --requests 40 \
    --fill-image-cache 64 ${QUANTEM_KEEP_DAEMON_LOGS:+--keep-daemon-logs "$out/daemon_logs_spin$spin"} \
    > "$out/http_spin$spin.json" 2> "$out/http_spin$spin.log"
  echo "== bench_http_viewer --http-spin-us $spin rc=$?"
  python3 scripts/device/summarise_http.py "$out/http_spin$spin.json"
done
