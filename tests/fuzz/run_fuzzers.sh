#!/usr/bin/env bash
# Writes the seed corpora and runs every fuzz target for a fixed budget.
# Usage: tests/fuzz/run_fuzzers.sh BUILD_DIR [SECONDS_PER_TARGET=20] [TARGET...]
# BUILD_DIR was configured with -DQUANTEM_FUZZ=ON (clang) and built with
# --target quantem_fuzzers. Seeds: our own encoders and synth (fuzz_seed_writer),
# h5py fixtures of every chunk-index kind (catalog_fixtures.py, when h5py is
# installed), the real detector files of shared/data/real (when present), and
# the committed regression inputs in tests/fuzz/regressions/<target>/.
# Exits non-zero on the first crash, leak, timeout or out-of-memory; the
# reproducer is left in the work folder printed at the start.
# Environment: QUANTEM_FUZZ_WORK (work folder, default a new temp folder),
# QUANTEM_FUZZ_ARGS (extra libFuzzer flags, e.g. "-runs=10000000").
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source_dir="$(cd "$here/../.." && pwd)"
build="$(cd "${1:?usage: run_fuzzers.sh BUILD_DIR [SECONDS] [TARGET...]}" && pwd)"
seconds="${2:-20}"
shift $(( $# >= 2 ? 2 : 1 ))
targets=("$@")
((${#targets[@]})) || targets=(chunk_decoder ans_reader chunk_index inspect_master inspector_reply query)

work="${QUANTEM_FUZZ_WORK:-$(mktemp -d /tmp/quantem-fuzz-XXXXXX)}"
mkdir -p "$work"
echo "fuzz work folder: $work"
bin="$build/tests/fuzz"
export LSAN_OPTIONS="suppressions=$here/lsan_suppressions.txt${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export HDF5_PLUGIN_PATH=/usr/lib/x86_64-linux-gnu/hdf5/serial/plugins

if [[ ! -d "$work/seeds" ]]; then
  hdf5_files=()
  fixtures="$work/fixtures"
  mkdir -p "$fixtures"
  if /usr/bin/python3 -c 'import h5py, hdf5plugin' 2>/dev/null; then
    # One stem ("fuzz") per folder: fuzz_inspect_master keeps synthesized shards of that stem.
    n=0
    while read -r options; do
      n=$((n + 1))
      mkdir -p "$fixtures/$n"
      /usr/bin/python3 "$source_dir/tests/support/python/catalog_fixtures.py" acquisition "$fixtures/$n" fuzz $options
    done <<'SPECS'
--shard-frames 2000 --det 2x2 --dtype uint8
--shard-frames 40 --det 4x4 --unlimited --userblock 1024
--shard-frames 8 --chunk-frames 4 --det 4x4
--shard-frames 1100 --libver latest --det 2x2 --dtype uint8
--shard-frames 9 --libver latest --filter none
--shard-frames 30 --libver latest --filter none --alloc-early
--shard-frames 1 --libver latest
--shard-frames 4,4 --filter lz4 --dtype uint32 --ntrigger 8 --nimages 1
--shard-frames 0 --raw-shape 2,2,4,4 --filter none
--shard-frames 4 --filter contiguous --sidecar 2,2 --mask 4x4:uint32:1,1=1
SPECS
    while IFS= read -r -d '' file; do hdf5_files+=("$file"); done < <(find "$fixtures" -name '*.h5' -print0)
  else
    echo "h5py/hdf5plugin not installed: no h5py fixture seeds"
  fi
  real="${QUANTEM_REAL_DATA_DIR:-$source_dir/../shared/data/real}"
  if [[ -d "$real" ]]; then
    while IFS= read -r -d '' file; do hdf5_files+=("$file"); done < <(find "$real" -name '*.h5' -size -4M -print0)
  fi
  "$bin/fuzz_seed_writer" "$work/seeds" "${hdf5_files[@]}"
fi

for target in "${targets[@]}"; do
  corpus="$work/corpus/$target"
  mkdir -p "$corpus" "$work/artifacts/$target"
  corpora=("$corpus" "$work/seeds/$target")
  [[ -d "$here/regressions/$target" ]] && corpora+=("$here/regressions/$target")
  echo "== fuzz_$target: ${seconds} s"
  # -rss_limit_mb / -malloc_limit_mb: an allocation driven by input sizes is a finding.
  # inspect_master: libhdf5 (not ours) asks malloc for sizes read from the file
  # (terabytes) and copes with NULL, as it gets in production; ASan returns NULL
  # for those too instead of stopping (decision 0012).
  # It also mallocs gigabytes it never touches (a size from the file, then a
  # read bounded by the file): only the resident set (-rss_limit_mb) counts there.
  asan_options="${ASAN_OPTIONS:-}"
  malloc_limit_mb=1024
  if [[ "$target" == inspect_master ]]; then
    asan_options="allocator_may_return_null=1${asan_options:+:$asan_options}"
    malloc_limit_mb=1048576
  fi
  # shellcheck disable=SC2086
  ASAN_OPTIONS="$asan_options" "$bin/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb="$malloc_limit_mb" \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/$target/" ${QUANTEM_FUZZ_ARGS:-} "${corpora[@]}" \
    > "$work/fuzz_$target.log" 2>&1 || {
    tail -n 60 "$work/fuzz_$target.log"
    echo "fuzz_$target FAILED: reproducer in $work/artifacts/$target/"
    exit 1
  }
  grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|Done [0-9]+ runs' "$work/fuzz_$target.log" || true
done
