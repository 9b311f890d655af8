#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over the bundle made by
# scripts/device/build-bundle.sh (carried as .bundle): nvidia-smi, the GPU test
# suites (once more with QUANTEM_DEBUG_SYNC=1), compute-sanitizer memcheck and
# racecheck on small decodes, then the benchmarks. Results go to $OUT (at most
# 8 files come back): tests.log, sanitizer.log, bench_*.json, summary.txt.
#
#   bash scripts/device/run.sh [quick|large|profile|masked]
#     quick: tests + sanitizer only; large: also a 1024x1024x192x192 u16 scan
#     (77 GB dense); profile: tests + sanitizer + Nsight Compute on a small scan;
#     masked: tests + sanitizer + the 512x512 u16 benchmark, the SASS of the
#     masked-sum kernel (sass_masked_sum.txt) and Nsight Compute on it alone
set -uo pipefail
bundle=$(pwd)/.bundle
out=${OUT:-/tmp/quantem-device-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export QUANTEM_REAL_DATA_DIR="$bundle/data/real"
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

note "commit $(cat "$bundle/COMMIT" 2>/dev/null) date $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$summary"
nvidia-smi > "$out/nvidia-smi.txt" 2>&1

tests=(lz4_block_host_tests ans_tests ans_reader_host_tests bitshuffle_lz4_gpu_tests ans_conformance_tests)
for test in "${tests[@]}"; do
  start=$(date +%s)
  "$bundle/$test" --gtest_brief=1 >> "$out/tests.log" 2>&1
  rc=$?
  note "test $test rc=$rc ($(( $(date +%s) - start )) s)"
done
QUANTEM_DEBUG_SYNC=1 "$bundle/bitshuffle_lz4_gpu_tests" --gtest_brief=1 >> "$out/tests.log" 2>&1
note "test bitshuffle_lz4_gpu_tests QUANTEM_DEBUG_SYNC=1 rc=$?"
grep -E "FAILED|Failure|error" "$out/tests.log" | head -20 | tee -a "$summary"

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$sanitizer" ]; then
  "$sanitizer" --tool memcheck --error-exitcode 9 "$bundle/bitshuffle_lz4_gpu_tests" \
    --gtest_filter='*Generated*:*Corrupt*:*RealDetector*' --gtest_brief=1 >> "$out/sanitizer.log" 2>&1
  note "memcheck bitshuffle_lz4 rc=$?"
  "$sanitizer" --tool racecheck --error-exitcode 9 "$bundle/bitshuffle_lz4_gpu_tests" \
    --gtest_filter='*Generated*' --gtest_brief=1 >> "$out/sanitizer.log" 2>&1
  note "racecheck bitshuffle_lz4 rc=$?"
  "$sanitizer" --tool memcheck --error-exitcode 9 "$bundle/ans_conformance_tests" \
    --gtest_filter='AnsConformance/1.*:AnsCudaDecoder.*' --gtest_brief=1 >> "$out/sanitizer.log" 2>&1
  note "memcheck ans rc=$?"
  "$sanitizer" --tool racecheck --error-exitcode 9 "$bundle/ans_conformance_tests" \
    --gtest_filter='AnsConformance/1.MaskedSums*' --gtest_brief=1 >> "$out/sanitizer.log" 2>&1
  note "racecheck ans rc=$?"
else
  note "compute-sanitizer not found"
fi

if [ "${1:-}" = "profile" ]; then
  # Nsight Compute on a small scan (leave the clocks alone): stall reasons and
  # throughput of the codec kernels, one launch each.
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for kernel in masked_sum_kernel decode_frames_kernel decode_blocks_kernel encode_streams_kernel; do
    "$ncu" --clock-control none -k "regex:$kernel" -c 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
      --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      "$bundle/bench_gpu_codec" --scan-rows 32 --scan-cols 512 --unique-frames 2048 --repeats 1 \
      >> "$out/ncu.txt" 2>&1
    note "ncu $kernel rc=$?"
  done
  grep -E "^  [a-z_]+.*\(|Duration|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc Active|Stall|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Executed Instructions  " "$out/ncu.txt" | head -80
fi

if [ "${1:-}" = "masked" ]; then
  cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  "$cuobjdump" -sass "$bundle/bench_gpu_codec" 2>&1 |
    awk '/Function : /{p = /masked_sum_kernel/} p' > "$out/sass_masked_sum.txt"
  note "sass masked_sum_kernel rc=$? lines $(wc -l < "$out/sass_masked_sum.txt")"
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  "$ncu" --clock-control none -k "regex:masked_sum_kernel" -c 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
    "$bundle/bench_gpu_codec" --scan-rows 32 --scan-cols 512 --unique-frames 2048 --repeats 1 > "$out/ncu.txt" 2>&1
  note "ncu masked_sum_kernel rc=$?"
  grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc Active|Executed Instructions  |Achieved Occupancy|Compute \(SM\) Throughput|Pipe|Stall" "$out/ncu.txt" | head -30
fi

if [ "${1:-}" != "quick" ] && [ "${1:-}" != "profile" ]; then
  "$bundle/bench_gpu_codec" --json "$out/bench_u16_512.json" > /dev/null 2>> "$out/tests.log"
  note "bench u16 512x512 rc=$?"
  "$bundle/bench_gpu_codec" --frames-per-group 1024 --repeats 3 --json "$out/bench_u16_512_g1024.json" \
    > /dev/null 2>> "$out/tests.log"
  note "bench u16 512x512 frames-per-group 1024 rc=$?"
  "$bundle/bench_gpu_codec" --dtype uint32 --preset dense --scan-rows 128 --scan-cols 512 --unique-frames 4096 \
    --json "$out/bench_u32_128x512.json" > /dev/null 2>> "$out/tests.log"
  note "bench u32 128x512 rc=$?"
  if [ "${1:-}" = "large" ]; then
    "$bundle/bench_gpu_codec" --scan-rows 1024 --scan-cols 1024 --full-decode 0 --repeats 3 \
      --json "$out/bench_u16_1024.json" > /dev/null 2>> "$out/tests.log"
    note "bench u16 1024x1024 rc=$?"
  fi
  for f in "$out"/bench_*.json; do
    [ -f "$f" ] || continue
    python3 - "$f" <<'PY' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1]))
m = r.get("masked_sum", {})
print(sys.argv[1].split("/")[-1],
      "bslz4 %.1f GB/s" % r["bslz4_decode"]["decoded_GBps"],
      "ok" if r["bslz4_decode"]["matches_host_frames"] and r["bslz4_decode"]["failed_chunks"] == 0 else "MISMATCH",
      "| ans enc %.1f GB/s" % r["ans_encode"]["dense_GBps"],
      "| ans dec %.1f GB/s diff %s" % (r.get("ans_decode", {}).get("dense_GBps", 0), r.get("ans_decode", {}).get("differing_bytes")),
      "| resident/stored %.3f" % r["resident_over_stored"],
      "| masked ans %.3f ms dense %s ms identical %s" % (m.get("ans_ms_median", 0), m.get("dense_ms_median"), m.get("sums_identical")),
      "| load %.3f s" % r["pipelined_load"]["seconds"])
PY
  done
fi
