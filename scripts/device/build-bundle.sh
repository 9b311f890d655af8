#!/usr/bin/env bash
# Builds the GPU tests and benchmarks on a CPU machine (nvcc, no GPU needed) and
# bundles them for a GPU machine: .bundle/ holds the binaries (rpath $ORIGIN/lib),
# .bundle/lib their non-glibc shared libraries (CUDA's runtime is linked
# statically; the driver comes from the GPU machine), .bundle/data/real the real
# detector files the tests read, .bundle/data/fixtures the CUDA backend tests'
# fixtures, .bundle/COMMIT the commit built.
#
#   scripts/device/build-bundle.sh [--archive] [SOURCE_DIR] [BUILD_DIR]
#
# SOURCE_DIR defaults to this checkout. Use a clean `git worktree` of the commit
# you want to measure when the working tree holds other people's unfinished work.
# --archive also writes .bundlez/bundle.tar.gz, the bundle compressed (it
# travels in less space; `scripts/device/run.sh build` unpacks it there).
# QUANTEM_BUNDLE_TARGETS (space separated) overrides the list of targets, e.g.
# to keep the bundle small. On the GPU machine, from the repository root:
#   scripts/device/run.sh build gpu-tests ...   (scripts/device/README.md)
set -euo pipefail
repo_root=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/device/bundle_common.sh
source "$repo_root/scripts/device/bundle_common.sh"
archive=0
[ "${1:-}" = --archive ] && { archive=1; shift; }
source_dir=${1:-$repo_root}
build_dir=${2:-$source_dir/build-bundle}
bundle=$repo_root/.bundle
read -r -a targets <<< "${QUANTEM_BUNDLE_TARGETS:-lz4_block_host_tests ans_tests ans_reader_host_tests bitshuffle_lz4_gpu_tests bitshuffle_lz4_encode_gpu_tests ans_conformance_tests bench_gpu_codec bench_export bench_chunk_writes cuda_backend_tests resident_conformance_test ring_sums_gpu_tests cuda_backend_bench bench_http_viewer quantem-gpu cuda_fault_injection_tests cuda_export_faults_tests bench_dense_peers pinned_host_bench bench_host_memory}"

# shellcheck disable=SC2016  # $ORIGIN is for the dynamic loader, not the shell
cmake -S "$source_dir" -B "$build_dir" -G Ninja -DQUANTEM_CUDA=ON -DQUANTEM_CUDA_ARCHITECTURES=90 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags '-DCMAKE_BUILD_RPATH=$ORIGIN/lib' >/dev/null
ninja -C "$build_dir" -j2 "${targets[@]}"

rm -rf "$bundle"
mkdir -p "$bundle/lib" "$bundle/data/real"
for target in "${targets[@]}"; do
  binary=$(find "$build_dir" -type f -name "$target" -perm -u+x | head -1)
  cp "$binary" "$bundle/"
  strip --strip-debug "$bundle/$target"
  copy_shared_libraries "$binary" "$bundle/lib"
done
# The official HDF5 bitshuffle filter (Debian's libh5bshuf.so, the GPU
# encoder's reference reader: QUANTEM_HDF5_PLUGIN_DIR=$bundle/lib/plugins).
mkdir -p "$bundle/lib/plugins"
cp -L /usr/lib/x86_64-linux-gnu/hdf5/serial/plugins/libh5bshuf.so "$bundle/lib/plugins/"
real=$source_dir/../shared/data/real
[ -d "$real" ] || real=$repo_root/../shared/data/real
mkdir -p "$bundle/data/real/eiger_h5_testmodes" "$bundle/data/real/arina/rsciio_test_00"
cp "$real"/eiger_h5_testmodes/*bslz4*.h5 "$bundle/data/real/eiger_h5_testmodes/"
cp "$real"/arina/rsciio_test_00/*.h5 "$bundle/data/real/arina/rsciio_test_00/"
# Fixtures of the CUDA backend's tests, written here by h5py + the official
# bitshuffle filter (the GPU machine has no hdf5plugin); tests read them
# through QUANTEM_GPU_FIXTURES.
fixtures=$bundle/data/fixtures
mkdir -p "$fixtures"
fixture() { HDF5_PLUGIN_PATH=/usr/lib/x86_64-linux-gnu/hdf5/serial/plugins /usr/bin/python3 \
  "$source_dir/tests/support/python/products_load_fixture.py" "$@" > /dev/null; }
fixture write "$fixtures" sharded --scan 9x7 --det 10x9 --shard-frames 40,23 --mask '1,1;2,3;9,8' \
  --masked-value 60000 --raw-frames 5,40
fixture write "$fixtures" lz4 --filter lz4 --scan 5x8 --det 9x7 --mask '4,4'
fixture write "$fixtures" inline --inline --scan 6x7 --det 8x5 --mask '0,4;7,0' --masked-value 999
fixture write "$fixtures" small --dtype uint8 --scan 4x5 --det 6x6 --mask '0,0'
fixture write "$fixtures" wide --dtype uint32 --scan 5x7 --det 7x5 --hot 100000 --mask '3,3' --masked-value 7
fixture write "$fixtures" narrow --dtype uint32 --scan 6x6 --det 8x7 --mask '2,2;5,6' --masked-value 200000
fixture write "$fixtures" blocks --scan 4x6 --det 64x72 --block-elements 1024 --shard-frames 10,14 --mask '3,5;60,70'
fixture write "$fixtures" hot --dtype uint32 --scan 4x4 --det 6x6 --hot 4000000000 --no-expected
fixture write "$fixtures" corrupt --scan 24x24 --det 32x32 --no-expected
fixture corrupt "$fixtures/corrupt_data_000001.h5" 500
finish_bundle "$bundle" "$source_dir" "$archive" bundle
