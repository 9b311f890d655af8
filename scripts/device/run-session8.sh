#!/usr/bin/env bash
# Session 8 on the GPU machine (issue 10: the load's GPU stages). JSON under $OUT.
#   bash scripts/device/run-session8.sh [loadprof|load|http|MODE of run-session7.sh]
# loadprof: every kernel of two loads under ncu (durations summed by kernel name,
#           per load), then the load alone, median of 5, without the profiler.
# load:     the load alone, median of 5, for each of QUANTEM_LOAD_VARIANTS.
# http:     run-session7.sh http with the busy-wait on, and the daemons' logs.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
what=${1:-loadprof}
case "$what" in
  loadprof|load) ;;
  http)
    # The viewer benchmark (run-session7.sh http, busy-wait on), then the
    # daemons' logs: each load's stage split (cold and warm) is logged there.
    QUANTEM_KEEP_DAEMON_LOGS=1 QUANTEM_SPIN_VARIANTS=${QUANTEM_SPIN_VARIANTS:-1000} \
      bash "$(dirname "$0")/run-session7.sh" http
    rc=$?
    for log in "$out"/daemon_logs_*/daemon-0.log; do
      echo "== $log"; grep -E "serving|budget|devices prepared|ready|admitted|CUDA load of|resident on" "$log" | head -12
    done
    exit $rc ;;
  *) exec bash "$(dirname "$0")/run-session7.sh" "$what" ;;
esac
echo "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ)"
data=/tmp/qv
synth_realistic_512 "$data"
master="$data/tilt0/tilt_master.h5"
if [ "$what" = loadprof ] && command -v ncu > /dev/null; then
  LD_LIBRARY_PATH="$bundle/lib" timeout 300 ncu --clock-control none --print-units base \
    --metrics gpu__time_duration.sum --csv "$bundle/cuda_backend_bench" "$master" --repeats 1 --load-only 1 \
    > "$out/ncu_load.csv" 2> "$out/ncu_load.log"
  echo "ncu rc=$?"
  python3 "$(dirname "$0")/ncu_kernel_table.py" "$out/ncu_load.csv" 2 > "$out/load_kernels.json"  # run 0 and run 1
  cat "$out/load_kernels.json"
fi
# QUANTEM_LOAD_VARIANTS: "name=cuda_backend_bench flags" entries separated by ';'.
run_load_variants "$master" "${QUANTEM_LOAD_VARIANTS:-default=}"
