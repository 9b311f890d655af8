#!/usr/bin/env bash
# Session 11 on the GPU machine (issue 10: the load's GPU passes). JSON under $OUT.
#   bash scripts/device/run-session11.sh [all|suites|load|loadprof|cold|http]
# all:      suites, loadprof, load.
# suites:   the GPU suites.
# loadprof: every kernel of two loads under ncu (run-session8.sh loadprof's
#           table, ms per load by kernel), QUANTEM_PROF_FLAGS passed to the bench.
# load:     the load alone, median of 5, for each of QUANTEM_LOAD_VARIANTS
#           (default: kept words per frame 2 / 4 / 3, the index walked each time),
#           with each load's stage split (decode and encode streams).
# cold, http: run-session10.sh cold / http.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
what=${1:-all}
case "$what" in
  all|suites|load|loadprof) ;;
  cold|http) exec bash "$(dirname "$0")/run-session10.sh" "$what" ;;
  *) echo "unknown mode $what" >&2; exit 2 ;;
esac
echo "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ)"
if [ "$what" = all ] || [ "$what" = suites ]; then
  run_all_gpu_suites
  [ "$what" = suites ] && exit 0
fi
data=/tmp/qv
synth_realistic_512 "$data"
master="$data/tilt0/tilt_master.h5"
if [ "$what" = all ] || [ "$what" = load ]; then
  run_load_variants "$master" \
    "${QUANTEM_LOAD_VARIANTS:-kept2=--kept-words-per-frame 2;kept4=--kept-words-per-frame 4;kept3=--kept-words-per-frame 3;kept2b=--kept-words-per-frame 2}"
  if [ -x "$bundle/cuda_backend_bench_base" ]; then  # the same loads by a baseline build (build-bundle of another commit)
    QUANTEM_BENCH_BIN=cuda_backend_bench_base run_load_variants "$master" "base=;base_b="
  fi
  for log in "$out"/load_*.json; do
    echo "-- $log"; grep -ho "CUDA load of.*" "$log" "${log%.json}.log" | tail -3 | cut -c1-250
  done
fi
if { [ "$what" = all ] || [ "$what" = loadprof ]; } && command -v ncu > /dev/null; then
  read -r -a prof_flags <<< "${QUANTEM_PROF_FLAGS:-}"
  LD_LIBRARY_PATH="$bundle/lib" timeout 300 ncu --clock-control none --print-units base \
    --metrics gpu__time_duration.sum --csv "$bundle/cuda_backend_bench" "$master" --repeats 1 --load-only 1 \
    "${prof_flags[@]}" > "$out/ncu_load.csv" 2> "$out/ncu_load.log"
  echo "ncu rc=$?"
  python3 "$(dirname "$0")/ncu_kernel_table.py" "$out/ncu_load.csv" 2 > "$out/load_kernels.json"
  cat "$out/load_kernels.json"
fi
