#!/usr/bin/env bash
# Session 9 on the GPU machine (issue 10: the recent frames, the load). JSON under $OUT.
#   bash scripts/device/run-session9.sh [all|suites|primitives|http|load|MODE of run-session8.sh]
# all:        suites, then primitives, then http (one command, one machine).
# suites:     the GPU suites (the recent frames: resident_conformance_test).
# primitives: cuda_backend_bench in-process (frames along a row, at new
#             positions, at seek points, with their stages), default tuning.
# http:       run-session8.sh http (busy-wait on, daemon logs kept).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
what=${1:-all}
case "$what" in
  all|suites|primitives) ;;
  *) exec bash "$(dirname "$0")/run-session8.sh" "$what" ;;
esac
echo "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ)"
if [ "$what" = all ] || [ "$what" = suites ]; then
  run_all_gpu_suites
  [ "$what" = suites ] && exit 0
fi
data=/tmp/qv
synth_realistic_512 "$data"
LD_LIBRARY_PATH="$bundle/lib" timeout 150 "$bundle/cuda_backend_bench" "$data/tilt0/tilt_master.h5" --repeats 3 \
  --json "$out/primitives.json" > /dev/null 2> "$out/primitives.log"
echo "primitives rc=$? $(python3 -c "import json; r=json.load(open('$out/primitives.json')); print(r['load_seconds_median'], r['resident_bytes'], json.dumps(r['request_primitives_ms']))")"
[ "$what" = primitives ] && exit 0
exec bash "$(dirname "$0")/run-session8.sh" http
