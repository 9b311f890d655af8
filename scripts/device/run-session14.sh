#!/usr/bin/env bash
# Session 14 on the GPU machine (issue 10: the load's kernels, line by line). JSON/text under $OUT.
#   bash scripts/device/run-session14.sh [srcprof|encode|load|http|cold|suites]
# srcprof: ncu source counters for one launch of each kernel in QUANTEM_KPROF_KERNELS
#          (';'-separated regexes of mangled names), exported per SASS instruction
#          with its CUDA line (--print-source sass and cuda,sass) and summarised
#          by ncu_source_lines.py (the hottest lines); the bench binary is
#          QUANTEM_BENCH_BIN (default cuda_backend_bench).
# encode:  the GPU suites, then loads by this bundle's bench and by
#          cuda_backend_bench_base and cuda_backend_bench_prev (other commits',
#          when the bundle holds them),
#          alternating (QUANTEM_LOAD_ROUNDS rounds of 5 loads each), then srcprof
#          of the measuring encode.
# Everything under $OUT is packed into out.tar.gz at the end (the device tool
# brings back only a few files).
# load, suites: run-session11.sh's; http, cold: run-session10.sh's.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
what=${1:-srcprof}
case "$what" in
  srcprof|encode) ;;
  load|suites|all|loadprof|kprof) exec bash "$here/run-session11.sh" "$what" ;;
  cold|http) exec bash "$here/run-session10.sh" "$what" ;;
  *) echo "unknown mode $what" >&2; exit 2 ;;
esac
echo "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ)"
data=/tmp/qv
synth_realistic_512 "$data"
master="$data/tilt0/tilt_master.h5"
bench=${QUANTEM_BENCH_BIN:-cuda_backend_bench}
if [ "$what" = encode ]; then
  run_all_gpu_suites
  for round in $(seq "${QUANTEM_LOAD_ROUNDS:-2}"); do
    run_load_variants "$master" "new$round="
    [ -x "$bundle/cuda_backend_bench_base" ] && QUANTEM_BENCH_BIN=cuda_backend_bench_base run_load_variants "$master" "base$round="
    [ -x "$bundle/cuda_backend_bench_prev" ] && QUANTEM_BENCH_BIN=cuda_backend_bench_prev run_load_variants "$master" "prev$round="
  done
  for log in "$out"/load_*.json; do
    echo "-- $log"; grep -ho "CUDA load of.*" "$log" "${log%.json}.log" | tail -3 | cut -c1-250
  done
fi
IFS=';' read -r -a kernels <<< "${QUANTEM_KPROF_KERNELS:-decode_blocks_kernelILi2EE;encode_streams_kernelItLb0EE}"
i=0
for kernel in "${kernels[@]}"; do
  i=$((i + 1))
  LD_LIBRARY_PATH="$bundle/lib" timeout 240 ncu --clock-control none --kernel-name-base mangled \
    -k "regex:$kernel" -s 3 -c 1 --import-source yes --source-folders "$(pwd)/kernels,$(pwd)/include" \
    --section SourceCounters --section InstructionStats --section WarpStateStats --section SpeedOfLight \
    -o "$out/src_$i" -f "$bundle/$bench" "$master" --repeats 1 --load-only 1 > "$out/src_$i.log" 2>&1
  echo "== srcprof $kernel rc=$?"
  ncu -i "$out/src_$i.ncu-rep" --page details > "$out/src_$i.details.txt" 2>&1
  grep -E "Duration|Executed Instructions|Issued Warp|Warp Cycles Per Issued|Stall" "$out/src_$i.details.txt" | head -20
  # SASS with its metrics per instruction (and, where ncu gives it, the CUDA line).
  for view in sass cuda,sass; do
    ncu -i "$out/src_$i.ncu-rep" --page source --csv --print-source "$view" > "$out/src_$i.${view/,/_}.csv" 2> "$out/src_$i.${view/,/_}.err"
    echo "source export $view rc=$? $(wc -c < "$out/src_$i.${view/,/_}.csv") B $(head -c 200 "$out/src_$i.${view/,/_}.err")"
    head -n 3 "$out/src_$i.${view/,/_}.csv" | cut -c1-400
  done
  gzip -f "$out"/src_$i.*.csv
  python3 "$here/ncu_source_lines.py" "$out/src_$i.cuda_sass.csv.gz" 25 | tee "$out/src_$i.top.txt" | cut -c1-200
  rm -f "$out/src_$i.ncu-rep"  # too large to bring back
done
tar -czf /tmp/quantem-out.tar.gz -C "$out" . && find "$out" -mindepth 1 -delete && mv /tmp/quantem-out.tar.gz "$out/out.tar.gz"
