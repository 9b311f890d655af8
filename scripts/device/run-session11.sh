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
# kprof:    ncu's sections (speed of light, memory, occupancy, warp states,
#           source counters) for one launch of each kernel named in
#           QUANTEM_KPROF_KERNELS (';'-separated regexes of the names ncu's
#           QUANTEM_KPROF_NAME_BASE gives: function (default), demangled or
#           mangled, e.g. encode_streams_kernelItLb0E), text under $OUT.
# cold, http: run-session10.sh cold / http.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
what=${1:-all}
case "$what" in
  all|suites|load|loadprof|kprof) ;;
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
if [ "$what" = kprof ] && command -v ncu > /dev/null; then
  IFS=';' read -r -a kernels <<< "${QUANTEM_KPROF_KERNELS:-dense_ring_sums;encode_streams_kernel<unsigned short, 0>}"
  i=0
  for kernel in "${kernels[@]}"; do
    i=$((i + 1))
    LD_LIBRARY_PATH="$bundle/lib" timeout 200 ncu --clock-control none \
      --kernel-name-base "${QUANTEM_KPROF_NAME_BASE:-function}" -k "regex:$kernel" -s 3 -c 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats --section SourceCounters --section InstructionStats \
      "$bundle/cuda_backend_bench" "$master" --repeats 1 --load-only 1 > "$out/kprof_$i.txt" 2>&1
    echo "== kprof $kernel rc=$?"
    grep -E "Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Shared Memory Config|Block Limit|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Bank" "$out/kprof_$i.txt" | head -60
  done
fi
