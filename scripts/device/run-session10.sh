#!/usr/bin/env bash
# Session 10 on the GPU machine (issue 10: start-up and the load). JSON under $OUT.
#   bash scripts/device/run-session10.sh [all|suites|load|cold|http|MODE of run-session9.sh]
# all:    suites, load, cold, http (one command, one machine).
# suites: the GPU suites.
# load:   the load alone, median of 5, for each of QUANTEM_LOAD_VARIANTS
#         (default: the batched-literal replay on and off).
# cold:   cold starts only (bench_http_viewer --requests 1), for each
#         QUANTEM_COLD_ENV entry (';'-separated "name=VAR=value ..."), with the
#         daemons' start-up timeline from their logs.
# http:   run-session8.sh http (every row; busy-wait on; daemon logs kept).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
what=${1:-all}
case "$what" in
  all|suites|load|cold) ;;
  http) exec bash "$(dirname "$0")/run-session8.sh" http ;;
  *) exec bash "$(dirname "$0")/run-session9.sh" "$what" ;;
esac
echo "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ)"
timeline() {  # the start-up lines of one daemon log
  grep -E "backend opened|prepared|serving|ready|CUDA load of|admitted" "$1" | head -12 | cut -c1-260
}
if [ "$what" = all ] || [ "$what" = suites ]; then
  run_all_gpu_suites
  [ "$what" = suites ] && exit 0
fi
data=/tmp/qv
synth_realistic_512 "$data"
master="$data/tilt0/tilt_master.h5"
if [ "$what" = all ] || [ "$what" = load ]; then
  run_load_variants "$master" \
    "${QUANTEM_LOAD_VARIANTS:-default=--keep-frame-index 0;kept_index=--keep-frame-index 1;default2=--keep-frame-index 0;kept_index2=--keep-frame-index 1}"
  [ "$what" = load ] && exit 0
fi
if [ "$what" = all ] || [ "$what" = cold ]; then
  for i in 1 2 3; do  # process start + CUDA's initialisation and context, nothing else
    t0=$(date +%s%N); run_bundle "$bin" info > /dev/null 2>&1; echo "info alone: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  done
  for i in 1 2; do  # CUDA init, context, the staging slots pinned in different ways (fresh processes)
    run_bundle "$bundle/pinned_host_bench" | tee -a "$out/pinned_host.jsonl"
  done
  IFS=';' read -r -a variants <<< "${QUANTEM_COLD_ENV:-default=QUANTEM_NOTHING=1}"
  for variant in "${variants[@]}"; do
    name=${variant%%=*}
    read -r -a env_settings <<< "${variant#*=}"
    env "${env_settings[@]}" LD_LIBRARY_PATH="$bundle/lib" timeout 200 "$bundle/bench_http_viewer" \
      --start-daemon "$bin" --data "$data" --session tilt0 --file tilt_master.h5 --daemon-arg=--gpus \
      --daemon-arg=auto --cold-starts "${QUANTEM_COLD_STARTS:-3}" --requests 1 --keep-daemon-logs "$out/cold_$name" \
      > "$out/cold_$name.json" 2> "$out/cold_$name.log"
    echo "== cold $name rc=$?: $(python3 -c "import json; r=json.load(open('$out/cold_$name.json')); print([(round(c['start_to_listening_s'],3), round(c['start_to_first_bf_body_s'],3), c['not_ready_answers'], c['first_bf_server_timing']) for c in r['cold_start']])")"
    for log in "$out/cold_$name"/daemon-*.log; do echo "-- $log"; timeline "$log"; done
  done
  [ "$what" = cold ] && exit 0
fi
QUANTEM_COLD_STARTS=2 bash "$(dirname "$0")/run-session8.sh" http
