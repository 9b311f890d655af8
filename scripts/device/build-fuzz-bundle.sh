#!/usr/bin/env bash
# Bundles the libFuzzer targets (built here in build-fuzz, clang + ASan/UBSan)
# for a long run on the GPU machine's CPU cores: .fuzzbundle/ holds the targets,
# their non-glibc shared libraries (lib/), the seed corpora written by
# fuzz_seed_writer (QUANTEM_FUZZ_WORK's seeds/ and corpus/ when given, so a
# long run continues from a local one), the committed regression inputs and
# the LSan suppressions. --archive also writes .bundlez/fuzzbundle.tar.gz.
# On the GPU machine, from the repository root:
#   scripts/device/run.sh fuzz-long   (QUANTEM_FUZZ_SECONDS, _JOBS, _TARGETS: scripts/device/README.md)
#
#   scripts/device/build-fuzz-bundle.sh [--archive] [BUILD_DIR=build-fuzz]
set -euo pipefail
repo_root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/device/bundle_common.sh
source "$repo_root/scripts/device/bundle_common.sh"
archive=0
[ "${1:-}" = --archive ] && { archive=1; shift; }
build=${1:-$repo_root/build-fuzz}
bundle=$repo_root/.fuzzbundle
work=${QUANTEM_FUZZ_WORK:-$(mktemp -d /tmp/quantem-fuzz-bundle-XXXXXX)}
rm -rf "$bundle"
mkdir -p "$bundle/lib" "$bundle/corpus"
for target in "$build"/tests/fuzz/fuzz_*; do
  name=$(basename "$target")
  [ "$name" = fuzz_seed_writer ] && continue
  cp "$target" "$bundle/"
  copy_shared_libraries "$target" "$bundle/lib"
done
if [ ! -d "$work/seeds" ]; then
  QUANTEM_FUZZ_WORK=$work "$repo_root/tests/fuzz/run_fuzzers.sh" "$build" 1 query > /dev/null
fi
cp -r "$work/seeds" "$bundle/seeds"
[ -d "$work/corpus" ] && cp -r "$work/corpus/." "$bundle/corpus/"
cp -r "$repo_root/tests/fuzz/regressions" "$bundle/regressions"
cp "$repo_root/tests/fuzz/lsan_suppressions.txt" "$bundle/"
finish_bundle "$bundle" "$repo_root" "$archive" fuzzbundle
