#!/usr/bin/env bash
# The suites of scripts/device/run.sh (sourced after lib.sh, not run). Each
# suite_<name> function records its steps in $work; run.sh turns them into
# $OUT/<name>.json. Knobs are environment variables, listed in README.md.
# shellcheck shell=bash source-path=SCRIPTDIR
# shellcheck source=scripts/device/lib.sh disable=SC2154  # lib.sh's variables, sourced by run.sh

# The GPU test binaries, in the order they are run.
gpu_test_binaries=(lz4_block_host_tests ans_tests ans_reader_host_tests bitshuffle_lz4_gpu_tests
                   bitshuffle_lz4_encode_gpu_tests ans_conformance_tests
                   ring_sums_gpu_tests resident_conformance_test cuda_backend_tests cuda_fault_injection_tests
                   cuda_export_faults_tests)

suite_build() {
  unpack_bundles
  needs "$bundle/COMMIT" "the bundle (scripts/device/build-bundle.sh, carried as .bundle or .bundlez)" || return
  step check_bundle 120 --stdout "$work/bundle.json" --json "$work/bundle.json" -- \
    python3 "$device_scripts/check_bundle.py" "$bundle"
  if command -v nvidia-smi > /dev/null || [ "$dry_run" = 1 ]; then
    step nvidia_smi 30 --stdout "$work/nvidia-smi.csv" -- nvidia-smi \
      --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem --format=csv
  fi
}

suite_gpu_tests() {
  local binary limit
  for binary in $(bundle_binaries "${gpu_test_binaries[@]}"); do
    case $binary in
      cuda_fault_injection_tests) limit=240 ;;
      cuda_export_faults_tests) limit=180 ;;
      cuda_backend_tests) limit=200 ;;
      resident_conformance_test) limit=150 ;;
      *) limit=90 ;;
    esac
    step "$binary" "$limit" --bundle --json "$work/$binary.json" -- \
      "$bundle/$binary" --gtest_brief=1 "--gtest_output=json:$work/$binary.json"
  done
  # Once more with a synchronisation after every launch: an asynchronous
  # error is then reported by the launch that caused it.
  for binary in $(bundle_binaries bitshuffle_lz4_gpu_tests resident_conformance_test); do
    local filter='*'
    [ "$binary" = resident_conformance_test ] && filter='ResidentConformance/1.*'
    step "${binary}_debug_sync" 150 --bundle --json "$work/${binary}_debug_sync.json" -- \
      env QUANTEM_DEBUG_SYNC=1 "$bundle/$binary" --gtest_brief=1 "--gtest_filter=$filter" \
      "--gtest_output=json:$work/${binary}_debug_sync.json"
  done
}

# QUANTEM_MEMCHECK_CHECKS: ';'-separated "TOOL BINARY GTEST_FILTER" entries.
# cuda_backend_tests' RunningOutOfDeviceMemory* runs out of device memory on
# purpose (memcheck reports its failed cudaMalloc as API errors), so it is left
# out; the fault injection's failed loads run with the leak check on.
default_memcheck_checks="memcheck bitshuffle_lz4_gpu_tests *;racecheck bitshuffle_lz4_gpu_tests *Generated*;\
memcheck ans_conformance_tests *;racecheck ans_conformance_tests AnsConformance/1.MaskedSums*;\
memcheck ring_sums_gpu_tests *;memcheck resident_conformance_test ResidentConformance/1.*;\
memcheck cuda_backend_tests -*RunningOutOfDeviceMemory*;memcheck cuda_fault_injection_tests *"
suite_memcheck() {
  local sanitizer checks check tool binary filter extra
  sanitizer=$(find_sanitizer)
  needs "$sanitizer" "compute-sanitizer" || return
  IFS=';' read -r -a checks <<< "${QUANTEM_MEMCHECK_CHECKS:-$default_memcheck_checks}"
  for check in "${checks[@]}"; do
    read -r tool binary filter <<< "$check"
    [ -n "$(bundle_binaries "$binary")" ] || continue
    extra=()
    [ "$binary" = cuda_fault_injection_tests ] && extra=(--leak-check full)
    step "${tool}_$binary" 300 --bundle -- "$sanitizer" --tool "$tool" --error-exitcode 9 "${extra[@]}" \
      "$bundle/$binary" "--gtest_filter=$filter" --gtest_brief=1
  done
}

# The same requests to `serve --gpus auto` and `serve --backend cpu` over the
# same folder: a u16 realistic acquisition (several shards) and a u32 dense one.
suite_e2e() {
  local data=$data_root/e2e gpu_url
  synth "$data/real16" real16 32x32 uint16 realistic --frames-per-shard 300 || return
  synth "$data/dense32" dense32 32x32 uint32 dense || return
  start_daemon serve_gpu "$data" --gpus auto || return
  local gpu_pid=$daemon_pid
  gpu_url=$daemon_url
  start_daemon serve_cpu "$data" --backend cpu || { daemon_pid=$gpu_pid; stop_daemon; return; }
  step compare 240 --json "$work/e2e.json" -- python3 "$device_scripts/e2e_compare.py" "$gpu_url" "$daemon_url" \
    real16,dense32 --json "$work/e2e.json"
  stop_daemon
  daemon_pid=$gpu_pid
  stop_daemon
  # A device index that does not exist: refused at start-up with a clear error.
  step refuses_missing_gpu 60 --bundle --expect-fail -- "$bin" serve "$data" --gpu 7 --port 0 \
    --port-file "$work/refused.port"
}

# run_load_variants MASTER: the load alone (--load-only 1, median
# of 5 after a first load) for each QUANTEM_LOAD_VARIANTS entry
# (';'-separated "name=cuda_backend_bench flags"), by this bundle's benchmark
# and, where the bundle holds them, by cuda_backend_bench_base and
# cuda_backend_bench_prev (other commits' builds), QUANTEM_LOAD_ROUNDS times.
run_load_variants() {
  local master=$1 variants variant name flags round benchmark
  IFS=';' read -r -a variants <<< "${QUANTEM_LOAD_VARIANTS:-}"
  [ ${#variants[@]} -gt 0 ] || return 0
  for round in $(seq "${QUANTEM_LOAD_ROUNDS:-1}"); do
    for benchmark in $(bundle_binaries cuda_backend_bench cuda_backend_bench_base cuda_backend_bench_prev); do
      for variant in "${variants[@]}"; do
        name=${variant%%=*}
        read -r -a flags <<< "${variant#*=}"
        step "load_${name}_$round${benchmark#cuda_backend_bench}" 150 --bundle \
          --json "$work/load_${benchmark}_${name}_$round.json" -- "$bundle/$benchmark" "$master" --repeats 5 \
          --load-only 1 "${flags[@]}" --json "$work/load_${benchmark}_${name}_$round.json"
      done
    done
  done
}

# Loads and request primitives in-process (cuda_backend_bench: load median of
# 5, stage split, reserved vs measured peaks, masked sums, CoM): 512x512 u16
# realistic and 128x512 u32 dense; QUANTEM_LARGE=1 adds the 1024x1024 u16
# load (77 GB dense, one load).
suite_bench_load() {
  needs "$bundle/cuda_backend_bench" "cuda_backend_bench in the bundle" || return
  synth_viewer_acquisition || return
  step load_u16_512 200 --bundle --json "$work/load_u16_512.json" -- "$bundle/cuda_backend_bench" "$viewer_master" \
    --repeats 5 --json "$work/load_u16_512.json"
  run_load_variants "$viewer_master"
  local u32=$data_root/u32_dense
  if synth "$u32" bench32 128x512 uint32 dense; then
    step load_u32_128x512 200 --bundle --json "$work/load_u32_128x512.json" -- "$bundle/cuda_backend_bench" \
      "$u32/bench32_master.h5" --repeats 5 --json "$work/load_u32_128x512.json"
  fi
  if [ "${QUANTEM_LARGE:-0}" = 1 ]; then
    synth_large_acquisition || return
    step load_u16_1024 200 --bundle --json "$work/load_u16_1024.json" -- "$bundle/cuda_backend_bench" \
      "$large_master" --repeats 1 --json "$work/load_u16_1024.json"
  fi
}

large_data=$data_root/large
large_master=$large_data/big/big_master.h5
synth_large_acquisition() {
  synth "$large_data/big" big 1024x1024 uint16 realistic
}

# Saving plans as a user would (export_bench.py): through the export job
# route of `serve --gpus auto` on the resident 512x512 u16 acquisition (full,
# detector bin 2, scan bin 2 of the 256x256 crop at the origin), a 256x256
# centred crop of the 1024x1024 u16 acquisition, the CLI from process start
# (load included), and the full export again with the host encoder (the
# baseline); each row beside the time to write as many bytes into the same
# folder (the disk's floor).
suite_bench_export() {
  synth_viewer_acquisition || return
  if [ -n "$(bundle_binaries bench_chunk_writes)" ]; then
    x mkdir -p "$data_root/exports"
    step chunk_writes 200 --bundle --stdout "$work/chunk_writes.json" --json "$work/chunk_writes.json" -- \
      "$bundle/bench_chunk_writes" "$data_root/exports" 100000 10240
  fi
  local exports=$data_root/exports rows=$work/rows
  x mkdir -p "$rows"
  if [ "$dry_run" = 0 ]; then
    cat > "$rows/resident.json" <<'ROWS'
[{"name": "full_512_u16", "via": "http", "session": "tilt0", "file": "tilt_master.h5", "plan": {}},
 {"name": "detbin2_512_u16", "via": "http", "session": "tilt0", "file": "tilt_master.h5", "plan": {"det_bin": 2}},
 {"name": "scanbin2_crop256_512_u16", "via": "http", "session": "tilt0", "file": "tilt_master.h5",
  "plan": {"scan_bin": 2, "row_start": 0, "row_stop": 256, "column_start": 0, "column_stop": 256}}]
ROWS
    cat > "$rows/host.json" <<'ROWS'
[{"name": "full_512_u16_host_encoder", "via": "http", "session": "tilt0", "file": "tilt_master.h5", "plan": {}}]
ROWS
    cat > "$rows/cli.json" <<ROWS
[{"name": "full_512_u16_cli", "via": "cli", "master": "$viewer_master", "arguments": ["--gpu", "0"]}]
ROWS
    cat > "$rows/large.json" <<'ROWS'
[{"name": "crop256_1024_u16", "via": "http", "session": "big", "file": "big_master.h5",
  "plan": {"row_start": 384, "row_stop": 640, "column_start": 384, "column_stop": 640}}]
ROWS
  fi
  step export_resident 400 --bundle --stdout "$work/export_resident.json" --json "$work/export_resident.json" -- \
    python3 "$device_scripts/export_bench.py" "$bin" "$viewer_data" "$exports" "$rows/resident.json" \
    --device-arg --gpus --device-arg auto
  step export_cli 200 --bundle --stdout "$work/export_cli.json" --json "$work/export_cli.json" -- \
    python3 "$device_scripts/export_bench.py" "$bin" "$viewer_data" "$exports" "$rows/cli.json"
  step export_host_encoder 200 --bundle --stdout "$work/export_host_encoder.json" \
    --json "$work/export_host_encoder.json" -- python3 "$device_scripts/export_bench.py" "$bin" "$viewer_data" \
    "$exports" "$rows/host.json" --device-arg --gpus --device-arg auto --env QUANTEM_EXPORT_HOST_ENCODER_FOR_TESTING=1
  if [ "${QUANTEM_EXPORT_LARGE:-1}" = 1 ] && synth "$data_root/export_large/big" big 1024x1024 uint16 realistic; then
    step export_large 300 --bundle --stdout "$work/export_large.json" --json "$work/export_large.json" -- \
      python3 "$device_scripts/export_bench.py" "$bin" "$data_root/export_large" "$exports" "$rows/large.json" \
      --device-arg --gpus --device-arg auto
  fi
}

# The viewer's requests through HTTP (bench_http_viewer) against serve --gpus
# auto on the 512x512 u16 acquisition, cold starts included, for each
# --http-spin-us of QUANTEM_SPIN_VARIANTS (default 1000, the daemon's default)
# and each glibc malloc setting of QUANTEM_MALLOC_VARIANTS ("default", and
# "reuse": large buffers reused, mmap threshold 32 MB, trim threshold 1 GB);
# beside it the floors: moving a body over loopback TCP, a process that only
# initialises CUDA (quantem-gpu info), pinning the staging slots
# (pinned_host_bench) and writing fresh vs recycled bodies (bench_host_memory)
# where the bundle holds them.
suite_bench_http() {
  needs "$bundle/bench_http_viewer" "bench_http_viewer in the bundle" || return
  synth_viewer_acquisition || return
  step loopback_floor 120 --stdout "$work/loopback_floor.json" --json "$work/loopback_floor.json" -- \
    python3 "$device_scripts/loopback_floor.py" 0 147456 1048576
  step loopback_floor_4mib 120 --stdout "$work/loopback_floor_4mib.json" --json "$work/loopback_floor_4mib.json" -- \
    env QUANTEM_FLOOR_SOCKET_BUFFER=4194304 python3 "$device_scripts/loopback_floor.py" 0 147456 1048576
  local i
  for i in 1 2 3; do step "info_$i" 60 --bundle -- "$bin" info; done
  local extra
  for extra in pinned_host_bench bench_host_memory; do
    [ -n "$(bundle_binaries "$extra")" ] || continue
    step "$extra" 120 --bundle --stdout "$work/$extra.json" -- "$bundle/$extra"
  done
  local spin malloc tunables name dense_peers=${QUANTEM_DENSE_PEERS_JSON:-}
  # The dense peers of an earlier bench-kernels run on this machine, for the table.
  [ -z "$dense_peers" ] && [ -f "$out/bench-kernels.json" ] && dense_peers=$out/bench-kernels.json
  for malloc in ${QUANTEM_MALLOC_VARIANTS:-default}; do
    tunables=""
    [ "$malloc" = reuse ] && tunables="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
    for spin in ${QUANTEM_SPIN_VARIANTS:-1000}; do
      name=http_spin${spin}_$malloc
      step "$name" 300 --bundle --stdout "$work/$name.json" --json "$work/$name.json" -- \
        env "GLIBC_TUNABLES=$tunables" "$bundle/bench_http_viewer" --start-daemon "$bin" --data "$viewer_data" \
        --session tilt0 --file tilt_master.h5 --daemon-arg=--gpus --daemon-arg=auto \
        "--daemon-arg=--http-spin-us=$spin" --cold-starts "${QUANTEM_COLD_STARTS:-2}" --requests 40 \
        --fill-image-cache 64 --keep-daemon-logs "$work/daemon_logs_$name"
      step "table_$name" 30 --stdout "$work/table_$name.md" -- python3 "$device_scripts/request_path_table.py" \
        "$work/$name.json" "$dense_peers" "$work/loopback_floor.json"
      step "stages_$name" 30 --stdout "$work/stages_$name.txt" -- python3 "$device_scripts/summarise_http.py" \
        "$work/$name.json"
    done
  done
  [ -n "$(bundle_binaries tools/wrk)" ] && wrk_against_gpu_daemon
}

# wrk (carried as .bundle/tools/wrk with its libraries in .bundle/lib) with 64
# connections for QUANTEM_WRK_SECONDS (60) over the viewer's mixed routes
# against serve --gpus auto (scripts/bench-wrk.sh). The bundle's libraries go
# to the bundle's programs only: the machine's curl needs its own libcurl.
wrk_against_gpu_daemon() {
  x mkdir -p "$work/bin"
  if [ "$dry_run" = 0 ]; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s "$@"\n' "$bundle" "$bin" > "$work/bin/quantem-gpu"
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/tools/wrk "$@"\n' "$bundle" "$bundle" > "$work/bin/wrk"
    chmod +x "$work/bin/quantem-gpu" "$work/bin/wrk"
  fi
  step wrk_gpu $((${QUANTEM_WRK_SECONDS:-60} + 140)) --stdout "$work/wrk_gpu.json" --json "$work/wrk_gpu.json" -- \
    env "QUANTEM_BIN=$work/bin/quantem-gpu" "WRK=$work/bin/wrk" bash "$repo_root/scripts/bench-wrk.sh" unused \
    "${QUANTEM_WRK_SECONDS:-60}" -- --gpus auto
}

# Every product of the request benchmark computed from dense device memory by
# the simplest kernel (bench_dense_peers, repeats QUANTEM_DENSE_REPEATS,
# default 15), then the request primitives in-process (cuda_backend_bench:
# a frame along a row, at a new position, at a seek point, masked sums, with
# their stages) for each QUANTEM_PRIMITIVE_VARIANTS entry (';'-separated
# "name=flags", e.g. "w512=--accumulate-threads 512;noseek=--frames-per-seek-point 0").
suite_bench_kernels() {
  if [ -n "$(bundle_binaries bench_dense_peers)" ]; then
    step dense_peers 400 --bundle --json "$work/dense_peers.json" -- "$bundle/bench_dense_peers" \
      --json "$work/dense_peers.json" --repeats "${QUANTEM_DENSE_REPEATS:-15}"
  fi
  needs "$bundle/cuda_backend_bench" "cuda_backend_bench in the bundle" || return
  synth_viewer_acquisition || return
  local variants variant name flags
  IFS=';' read -r -a variants <<< "${QUANTEM_PRIMITIVE_VARIANTS:-default=}"
  for variant in "${variants[@]}"; do
    name=${variant%%=*}
    read -r -a flags <<< "${variant#*=}"
    step "primitives_$name" 200 --bundle --json "$work/primitives_$name.json" -- "$bundle/cuda_backend_bench" \
      "$viewer_master" --repeats 3 "${flags[@]}" --json "$work/primitives_$name.json"
  done
}

# The codec benchmark: 512x512 u16 realistic (default groups, then 1024
# frames per group), 128x512 u32 dense; QUANTEM_LARGE=1 adds 1024x1024 u16.
suite_bench_codec() {
  needs "$bundle/bench_gpu_codec" "bench_gpu_codec in the bundle" || return
  step codec_u16_512 200 --bundle --json "$work/codec_u16_512.json" -- "$bundle/bench_gpu_codec" \
    --json "$work/codec_u16_512.json"
  step codec_u16_512_g1024 200 --bundle --json "$work/codec_u16_512_g1024.json" -- "$bundle/bench_gpu_codec" \
    --frames-per-group 1024 --repeats 3 --json "$work/codec_u16_512_g1024.json"
  step codec_u32_128x512 200 --bundle --json "$work/codec_u32_128x512.json" -- "$bundle/bench_gpu_codec" \
    --dtype uint32 --preset dense --scan-rows 128 --scan-cols 512 --unique-frames 4096 \
    --json "$work/codec_u32_128x512.json"
  if [ "${QUANTEM_LARGE:-0}" = 1 ]; then
    step codec_u16_1024 300 --bundle --json "$work/codec_u16_1024.json" -- "$bundle/bench_gpu_codec" \
      --scan-rows 1024 --scan-cols 1024 --full-decode 0 --repeats 3 --json "$work/codec_u16_1024.json"
  fi
}

# Admission with a user's budget (--device-budget, default 52.2GB): the
# 1024x1024 acquisition admitted and loaded, then seven 512x512 tilts beside
# it; the in-process 1024x1024 load's admitted, reserved and measured peaks;
# an acquisition that cannot fit a 2 GB budget refused with 413 before any
# allocation.
suite_admission() {
  synth_viewer_acquisition || return
  synth_large_acquisition || return
  local i
  for i in 0 1 2 3 4 5 6; do
    [ -d "$large_data/tilt$i" ] && [ "$dry_run" = 0 ] && continue
    x cp -al "$viewer_data/tilt0" "$large_data/tilt$i"
  done
  start_daemon serve_budget "$large_data" --gpus auto --device-budget "${QUANTEM_ADMISSION_BUDGET:-52.2GB}" || return
  step admission_proof 300 --json "$work/admission_proof.json" -- python3 "$device_scripts/admission_proof.py" \
    "$daemon_url" big tilt0,tilt1,tilt2,tilt3,tilt4,tilt5,tilt6 --json "$work/admission_proof.json"
  stop_daemon
  if [ -n "$(bundle_binaries cuda_backend_bench)" ]; then
    step load_u16_1024 200 --bundle --json "$work/load_u16_1024.json" -- "$bundle/cuda_backend_bench" \
      "$large_master" --repeats 1 --json "$work/load_u16_1024.json"
  fi
  start_daemon serve_2gb "$viewer_data" --gpus auto --device-budget 2GB || return
  step refusal_413 120 --json "$work/refusal_413.json" -- python3 "$device_scripts/admission_refusal.py" \
    "$daemon_url" tilt0 tilt_master.h5 --json "$work/refusal_413.json"
  stop_daemon
}

# QUANTEM_SOAK_CYCLES (default 200) load/evict cycles of the 512x512 u16
# acquisition through HTTP against serve --gpus auto, device memory and the
# daemon's RSS sampled along the way.
suite_soak() {
  synth_viewer_acquisition || return
  [ "$dry_run" = 1 ] || echo "  device memory used before the daemon: $(device_memory_used)" | tee "$work/memory.txt"
  start_daemon serve_soak "$viewer_data" --gpus auto || return
  step soak_cycles 500 --json "$work/soak.json" -- python3 "$device_scripts/soak_cycles.py" "$daemon_url" tilt0 \
    tilt_master.h5 "$daemon_pid" "${QUANTEM_SOAK_CYCLES:-200}" --json "$work/soak.json"
  stop_daemon
  [ "$dry_run" = 1 ] || echo "  device memory used after the daemon exited: $(device_memory_used)" | tee -a "$work/memory.txt"
}

# The catalog of a large data folder (tests/bench/bench_catalog.py):
# QUANTEM_CATALOG_COUNT (default 20000) small acquisitions, one per session
# folder (one `quantem-gpu synth` acquisition copied; no h5py needed), written
# once under $data_root and kept; then against the bundle's `serve --backend
# cpu` for each of QUANTEM_CATALOG_WORKERS (default "0 2": one inspector
# worker per core, then two, the first build's scaling with cores): first
# build, restart, refresh, a new acquisition, 304 polls, RSS.
suite_catalog() {
  needs "$bin" "the bundle's quantem-gpu" || return
  local count=${QUANTEM_CATALOG_COUNT:-20000} workers
  for workers in ${QUANTEM_CATALOG_WORKERS:-0 2}; do
    step "catalog_workers_$workers" 240 --bundle --stdout "$work/catalog_workers_$workers.json" \
      --json "$work/catalog_workers_$workers.json" -- python3 "$repo_root/tests/bench/bench_catalog.py" \
      --binary "$bin" --count "$count" --folder "$data_root/catalog-$count" --inspect-workers "$workers"
  done
}

# libFuzzer over .fuzzbundle (scripts/device/build-fuzz-bundle.sh): each target of
# QUANTEM_FUZZ_TARGETS runs QUANTEM_FUZZ_JOBS processes on one shared corpus
# for QUANTEM_FUZZ_SECONDS, all targets at once, with the limits of
# tests/fuzz/run_fuzzers.sh. fuzz_long_report.py sums the executions per
# target and lists crashes; crashing inputs and the grown corpora are archived.
suite_fuzz_long() {
  unpack_bundles
  needs "$fuzz_bundle/COMMIT" "the fuzz bundle (scripts/device/build-fuzz-bundle.sh)" || return
  local seconds=${QUANTEM_FUZZ_SECONDS:-450} jobs=${QUANTEM_FUZZ_JOBS:-5} target corpora
  local targets
  read -r -a targets <<< "${QUANTEM_FUZZ_TARGETS:-query chunk_decoder chunk_index}"
  for target in "${targets[@]}"; do
    x mkdir -p "$fuzz_bundle/corpus/$target" "$work/artifacts/$target" "$work/logs/$target"
    corpora=("$fuzz_bundle/corpus/$target" "$fuzz_bundle/seeds/$target")
    [ -d "$fuzz_bundle/regressions/$target" ] && corpora+=("$fuzz_bundle/regressions/$target")
    local run=(step "fuzz_$target" $((seconds + 120)) -- env -C "$work/logs/$target" "LD_LIBRARY_PATH=$fuzz_bundle/lib"
               "LSAN_OPTIONS=suppressions=$fuzz_bundle/lsan_suppressions.txt" "$fuzz_bundle/fuzz_$target"
               "-jobs=$jobs" "-workers=$jobs" "-max_total_time=$seconds" -timeout=10 -rss_limit_mb=2048
               -malloc_limit_mb=1024 -print_final_stats=1 "-artifact_prefix=$work/artifacts/$target/" "${corpora[@]}")
    if [ "$dry_run" = 1 ]; then "${run[@]}"; else "${run[@]}" & fi
  done
  [ "$dry_run" = 1 ] || wait
  step report 60 --stdout "$work/fuzz-long.txt" --json "$work/fuzz_long.json" -- \
    python3 "$device_scripts/fuzz_long_report.py" "$work" "$seconds" --json "$work/fuzz_long.json" "${targets[@]}"
  step archive 120 -- tar -czf "$work/corpus_and_artifacts.tar.gz" -C "$fuzz_bundle" corpus -C "$work" artifacts
  x rm -rf "$work/artifacts"
}

# Nsight Compute (clocks left alone) over cuda_backend_bench on the 512x512
# u16 acquisition, the parts of QUANTEM_PROFILE_PARTS (default "load request
# source"):
#   load:    every kernel of two loads, ms and launches per load by kernel (ncu_kernel_table.py)
#   request: the request primitives' kernels by kernel and grid (ncu_kernel_table.py --by-grid)
#   source:  source counters of one launch of each kernel of QUANTEM_SOURCE_KERNELS (regexes of
#            mangled names), the hottest CUDA lines (ncu_source_lines.py)
#   kernels: ncu's sections for one launch of each kernel of QUANTEM_SECTION_KERNELS (function names)
#   codec:   sections of the codec kernels in bench_gpu_codec, and the masked-sum kernel's SASS
# QUANTEM_BENCH_BIN: another benchmark binary of the bundle (e.g. cuda_backend_bench_base).
suite_profile() {
  local ncu
  ncu=$(find_ncu)
  [ "$dry_run" = 1 ] && ncu=${ncu:-ncu}
  needs "$ncu" "Nsight Compute (ncu)" || return
  synth_viewer_acquisition || return
  local bench=$bundle/${QUANTEM_BENCH_BIN:-cuda_backend_bench} part
  for part in ${QUANTEM_PROFILE_PARTS:-load request source}; do
    case $part in
      load) profile_load "$ncu" "$bench" ;;
      request) profile_request "$ncu" "$bench" ;;
      source) profile_source "$ncu" "$bench" ;;
      kernels) profile_sections "$ncu" "$bench" ;;
      codec) profile_codec "$ncu" ;;
      *) echo "  unknown profile part $part"; record "part_$part" 2 0 0 "" "unknown part" ;;
    esac
  done
}

profile_load() {
  local ncu=$1 bench=$2
  step ncu_load 400 --bundle --stdout "$work/ncu_load.csv" -- "$ncu" --clock-control none --print-units base \
    --metrics gpu__time_duration.sum --csv "$bench" "$viewer_master" --repeats 1 --load-only 1 || return
  step load_kernels 60 --stdout "$work/load_kernels.json" --json "$work/load_kernels.json" -- \
    python3 "$device_scripts/ncu_kernel_table.py" "$work/ncu_load.csv" 2
}

profile_request() {
  local ncu=$1 bench=$2
  step ncu_request 400 --bundle --stdout "$work/ncu_request.csv" -- "$ncu" --clock-control none --print-units base \
    --metrics gpu__time_duration.sum,launch__grid_size \
    --kernel-name 'regex:masked_sum_kernel|add_ring_sums|narrow_plan|accumulate_frames' --launch-count 600 --csv \
    "$bench" "$viewer_master" --repeats 1 || return
  step request_kernels 60 --stdout "$work/request_kernels.json" --json "$work/request_kernels.json" -- \
    python3 "$device_scripts/ncu_kernel_table.py" "$work/ncu_request.csv" 1 --by-grid
}

profile_source() {
  local ncu=$1 bench=$2 kernels kernel i=0 view
  IFS=';' read -r -a kernels <<< "${QUANTEM_SOURCE_KERNELS:-decode_blocks_kernelILi2EE;encode_streams_kernelItLb0EE}"
  for kernel in "${kernels[@]}"; do
    i=$((i + 1))
    step "ncu_source_$i" 300 --bundle -- "$ncu" --clock-control none --kernel-name-base mangled -k "regex:$kernel" \
      -s 3 -c 1 --import-source yes --source-folders "$repo_root/kernels,$repo_root/include" \
      --section SourceCounters --section InstructionStats --section WarpStateStats --section SpeedOfLight \
      -o "$work/source_$i" -f "$bench" "$viewer_master" --repeats 1 --load-only 1 || continue
    step "details_$i" 120 --stdout "$work/source_$i.details.txt" -- "$ncu" -i "$work/source_$i.ncu-rep" \
      --page details
    for view in sass cuda,sass; do
      step "export_${i}_${view/,/_}" 120 --stdout "$work/source_$i.${view/,/_}.csv" -- "$ncu" \
        -i "$work/source_$i.ncu-rep" --page source --csv --print-source "$view"
    done
    step "hottest_lines_$i" 60 --stdout "$work/source_$i.top.txt" -- python3 "$device_scripts/ncu_source_lines.py" \
      "$work/source_$i.cuda_sass.csv" 25
    x rm -f "$work/source_$i.ncu-rep"  # too large to bring back
  done
}

profile_sections() {
  local ncu=$1 bench=$2 kernels kernel i=0
  IFS=';' read -r -a kernels <<< "${QUANTEM_SECTION_KERNELS:-dense_ring_sums;encode_streams_kernel<unsigned short, 0>}"
  for kernel in "${kernels[@]}"; do
    i=$((i + 1))
    step "sections_$i" 300 --bundle --stdout "$work/sections_$i.txt" -- "$ncu" --clock-control none \
      --kernel-name-base "${QUANTEM_KERNEL_NAME_BASE:-function}" -k "regex:$kernel" -s 3 -c 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats --section SourceCounters --section InstructionStats \
      "$bench" "$viewer_master" --repeats 1 --load-only 1
  done
}

profile_codec() {
  local ncu=$1 kernel
  needs "$bundle/bench_gpu_codec" "bench_gpu_codec in the bundle" || return
  for kernel in masked_sum_kernel decode_frames_kernel decode_blocks_kernel encode_streams_kernel; do
    step "sections_$kernel" 300 --bundle --stdout "$work/sections_$kernel.txt" -- "$ncu" --clock-control none \
      -k "regex:$kernel" -c 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section InstructionStats --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section MemoryWorkloadAnalysis "$bundle/bench_gpu_codec" --scan-rows 32 --scan-cols 512 \
      --unique-frames 2048 --repeats 1
  done
  local cuobjdump
  cuobjdump=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  # The masked-sum kernel's SASS alone (the benchmark holds every codec kernel).
  # shellcheck disable=SC2016  # expanded by the inner shell
  step sass_masked_sum 120 --stdout "$work/sass_masked_sum.txt" -- bash -c \
    '"$1" -sass "$2" | awk '"'"'/Function : /{p = /masked_sum_kernel/} p'"'"'' _ "$cuobjdump" "$bundle/bench_gpu_codec"
}
