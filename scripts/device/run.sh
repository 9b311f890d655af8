#!/usr/bin/env bash
# The GPU machine's runs, from the repository root, over the bundle that
# scripts/device/build-bundle.sh makes on a CPU machine (carried as .bundle, or
# compressed as .bundlez/bundle.tar.gz):
#
#   scripts/device/run.sh [--dry-run] SUITE...
#
# Each suite writes $OUT/<suite>.json (its steps with their exit status and
# time, and the JSON its programs wrote) and prints one summary line; its logs
# and raw outputs are appended to $OUT/logs.tar; the summary lines also go to
# $OUT/summary.txt. The suites' figures go into docs/benchmarks/results/ and
# docs/benchmarks.md (scripts/benchmarks_page.py --merge). --dry-run prints
# what each suite would run, runs nothing.
# Exit status: 0 when every suite passed, 1 otherwise, 2 for a usage error.
# Environment knobs of each suite: scripts/device/README.md.
set -uo pipefail

suite_names=(build gpu-tests memcheck e2e bench-load bench-http bench-export bench-kernels bench-codec admission soak
             catalog fuzz-long profile)

usage() {
  cat <<'EOF'
usage: scripts/device/run.sh [--dry-run] SUITE...
suites:
  build          unpack a carried .bundlez archive; check the bundle's binaries and libraries
  gpu-tests      the GPU test binaries (gtest JSON per binary), some again with QUANTEM_DEBUG_SYNC=1
  memcheck       compute-sanitizer memcheck/racecheck over the GPU test binaries
  e2e            serve --gpus auto vs serve --backend cpu, same requests, same answers (e2e_compare.py)
  bench-load     cuda_backend_bench: loads and request primitives, 512x512 u16 and 128x512 u32
  bench-http     bench_http_viewer against serve --gpus auto, the loopback floor, cold starts
  bench-export   saving plans through the export route and the CLI (export_bench.py), each beside the disk's floor
  bench-kernels  bench_dense_peers (the dense peer of every product) and the in-process primitives
  bench-codec    bench_gpu_codec: bitshuffle/LZ4 decode, ANS encode/decode, masked sums
  admission      admission through HTTP under a device budget (admission_proof.py), a 413 refusal
  soak           load/evict cycles through HTTP with device memory and RSS sampled (soak_cycles.py)
  catalog        bench_catalog.py: 20,000 small acquisitions, serve --backend cpu, 16 vs 2 inspector workers
  fuzz-long      libFuzzer on the machine's CPU cores over .fuzzbundle (scripts/device/build-fuzz-bundle.sh)
  profile        Nsight Compute tables: kernels of a load, request kernels, hottest source lines
EOF
}

dry_run=0
suites=()
for arg in "$@"; do
  case $arg in
    --dry-run|-n) dry_run=1 ;;
    -h|--help) usage; exit 0 ;;
    *)
      known=0
      for name in "${suite_names[@]}"; do [ "$arg" = "$name" ] && known=1; done
      if [ "$known" = 0 ]; then
        echo "run.sh: unknown suite or option: $arg" >&2
        usage >&2
        exit 2
      fi
      suites+=("$arg") ;;
  esac
done
if [ ${#suites[@]} = 0 ]; then
  usage >&2
  exit 2
fi

# shellcheck source=scripts/device/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=scripts/device/suites.sh
source "$(dirname "$0")/suites.sh"

if [ "$dry_run" = 0 ]; then
  mkdir -p "$out"
  rm -f "$out/logs.tar"
  : > "$out/summary.txt"
fi
failed=0
for suite in "${suites[@]}"; do
  work=$out/$suite
  if [ "$dry_run" = 1 ]; then
    echo "== $suite -> $out/$suite.json"
    "suite_${suite//-/_}"
    continue
  fi
  rm -rf "$work" && mkdir -p "$work"
  : > "$work/steps.tsv"
  echo "== $suite $(date -u +%FT%TZ)"
  start=$EPOCHREALTIME
  "suite_${suite//-/_}"
  seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')
  line=$(python3 "$device_scripts/suite_report.py" "$suite" "$work" "$out/$suite.json" "$seconds" "$bundle/COMMIT")
  rc=$?
  [ "$rc" = 0 ] || failed=1
  echo "$line" | tee -a "$out/summary.txt"
  # The suite's figures into docs/benchmarks/results/ and docs/benchmarks.md of this checkout.
  python3 "$repo_root/scripts/benchmarks_page.py" --merge "$out/$suite.json" | tee -a "$out/summary.txt" ||
    echo "  docs/benchmarks.md not updated" | tee -a "$out/summary.txt"
  # Large raw outputs compressed, then everything appended to one archive.
  find "$work" -type f -size +1M ! -name '*.gz' -exec gzip -f {} +
  tar -rf "$out/logs.tar" -C "$out" "$suite" && rm -rf "$work"
done
if [ "$dry_run" = 0 ]; then
  echo "== summary ($out)"
  cat "$out/summary.txt"
fi
exit "$failed"
