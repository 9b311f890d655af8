#!/usr/bin/env bash
# Helpers of scripts/device/run.sh (sourced, not run): where the bundle, the
# data and the results are; steps that record their exit status and time for
# the suite's JSON; the daemons and synthetic acquisitions the suites share;
# and the dry run, in which every command is printed instead of run.

# shellcheck disable=SC2034  # the variables below are read by run.sh and suites.sh
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
device_scripts=$repo_root/scripts/device
bundle=${QUANTEM_BUNDLE:-$repo_root/.bundle}
fuzz_bundle=${QUANTEM_FUZZ_BUNDLE:-$repo_root/.fuzzbundle}
bundle_archives=$repo_root/.bundlez
out=${OUT:-/tmp/quantem-device-out}
# Synthetic acquisitions are written once per machine and kept between suites.
data_root=${QUANTEM_DEVICE_DATA:-/tmp/quantem-device-data}
bin=$bundle/quantem-gpu
dry_run=${dry_run:-0}
suite=""  # the suite being run
work=""   # its folder of logs and raw outputs, $out/<suite>

# printf %q of each argument, space separated: a command line that can be pasted.
quoted() {
  local IFS=' '
  local words=()
  local word
  for word in "$@"; do words+=("$(printf '%q' "$word")"); done
  echo "${words[*]}"
}

# x CMD...: runs CMD, or prints it in a dry run (housekeeping, not a recorded step).
x() {
  if [ "$dry_run" = 1 ]; then
    echo "    $(quoted "$@")"
  else
    "$@"
  fi
}

# One row of the suite's step table (tab separated; suite_report.py reads it).
record() {  # name rc seconds expect_fail json_file command
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$work/steps.tsv"
}

# step NAME SECONDS [--bundle] [--stdout FILE] [--json FILE] [--expect-fail] -- CMD...
# Runs CMD under `timeout SECONDS`; stderr (and stdout, unless --stdout) go to
# $work/NAME.log. --bundle: with the bundle's shared libraries, real detector
# files and test fixtures. --json FILE: that file's JSON goes into the suite's
# JSON under this step. --expect-fail: the step passes when CMD fails (a
# refusal). Returns 0 when the step passed.
step() {
  local name=$1 limit=$2
  shift 2
  local use_bundle=0 stdout="" json="" expect_fail=0
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case $1 in
      --bundle) use_bundle=1 ;;
      --stdout) stdout=$2; shift ;;
      --json) json=$2; shift ;;
      --expect-fail) expect_fail=1 ;;
      *) echo "step $name: unknown option $1" >&2; return 2 ;;
    esac
    shift
  done
  shift
  local wrapper=()
  [ "$use_bundle" = 1 ] && wrapper=(env "LD_LIBRARY_PATH=$bundle/lib" "QUANTEM_REAL_DATA_DIR=$bundle/data/real"
                                   "QUANTEM_GPU_FIXTURES=$bundle/data/fixtures"
                                   "QUANTEM_HDF5_PLUGIN_DIR=$bundle/lib/plugins")
  if [ "$dry_run" = 1 ]; then
    echo "  $name:$([ "$use_bundle" = 1 ] && echo " [bundle libraries]") $(quoted "$@")${stdout:+ > $stdout}"
    return 0
  fi
  local log=$work/$name.log start=$EPOCHREALTIME rc
  if [ -n "$stdout" ]; then
    timeout "$limit" "${wrapper[@]}" "$@" > "$stdout" 2>> "$log"
  else
    timeout "$limit" "${wrapper[@]}" "$@" >> "$log" 2>&1
  fi
  rc=$?
  local seconds
  seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }')
  record "$name" "$rc" "$seconds" "$expect_fail" "${json#"$work"/}" "$(quoted "$@")"
  local passed=1
  if [ "$expect_fail" = 1 ]; then [ "$rc" != 0 ] || passed=0; else [ "$rc" = 0 ] || passed=0; fi
  echo "  $name rc=$rc (${seconds} s)$([ "$passed" = 1 ] || echo " FAILED")"
  if [ "$passed" = 0 ] && [ -f "$log" ]; then  # why, from the log: its error lines, else its end
    grep -E "^\[  FAILED|Failure|Expected|Which is|ERROR|rror:" "$log" | head -8 | sed 's/^/    | /' | grep . ||
      tail -n 3 "$log" | sed 's/^/    | /'
  fi
  [ "$passed" = 1 ]
}

# needs FILE WHAT: false (and a recorded failure) when FILE is not there; a
# suite skips what its binary or data is missing for. Always true in a dry run.
needs() {
  [ "$dry_run" = 1 ] && return 0
  [ -e "$1" ] && return 0
  echo "  missing $1 ($2)"
  record "missing_$(basename "$1")" 127 0 0 "" "$2"
  return 1
}

# The bundle binaries among the names given (every name in a dry run).
bundle_binaries() {
  local name
  for name in "$@"; do
    if [ "$dry_run" = 1 ] || [ -x "$bundle/$name" ]; then echo "$name"; fi
  done
}

# Unpacks .bundlez/bundle.tar.gz into .bundle and .bundlez/fuzzbundle.tar.gz
# into .fuzzbundle where the archive is newer than the folder (or the folder
# is missing): the compressed form is what travels to the GPU machine.
unpack_bundles() {
  local archive target
  for archive in "$bundle_archives/bundle.tar.gz:$bundle" "$bundle_archives/fuzzbundle.tar.gz:$fuzz_bundle"; do
    target=${archive#*:}
    archive=${archive%%:*}
    [ -f "$archive" ] || continue
    if [ "$dry_run" = 1 ] || [ ! -d "$target" ] || [ "$archive" -nt "$target/COMMIT" ]; then
      x rm -rf "$target"
      x mkdir -p "$target"
      step "unpack_$(basename "$archive" .tar.gz)" 120 -- tar -xzf "$archive" -C "$target"
    fi
  done
}

# synth DIR PREFIX SCAN DTYPE PRESET [FLAGS...]: a synthetic acquisition of
# 192x192 frames written once (kept while DIR/.complete exists), then read
# once so the page cache is warm, as it is for a user's second look.
synth() {
  local dir=$1 prefix=$2 scan=$3 dtype=$4 preset=$5
  shift 5
  if [ "$dry_run" = 1 ]; then  # printed once per run, as it is written once per machine
    case $dry_run_synthesised in *" $dir "*) return 0 ;; esac
    dry_run_synthesised+=" $dir "
  fi
  if [ "$dry_run" = 1 ] || [ ! -f "$dir/.complete" ]; then
    x rm -rf "$dir"
    x mkdir -p "$dir"
    step "synth_${prefix}_$scan" 900 --bundle -- "$bin" synth "$dir" --prefix "$prefix" --scan "$scan" \
      --detector 192x192 --dtype "$dtype" --preset "$preset" --threads "$(nproc)" "$@" || return 1
    needs "$dir/${prefix}_master.h5" "the master synth should have written" || return 1
    x touch "$dir/.complete"
  fi
  [ "$dry_run" = 1 ] || cat "$dir"/*.h5 > /dev/null 2>&1 || true
}

dry_run_synthesised=" "

# The 512x512x192x192 u16 realistic acquisition most benchmarks use: session
# tilt0 of the folder $viewer_data, master tilt_master.h5.
viewer_data=$data_root/viewer
viewer_master=$viewer_data/tilt0/tilt_master.h5
synth_viewer_acquisition() {
  synth "$viewer_data/tilt0" tilt 512x512 uint16 realistic
}

# start_daemon NAME DATA_FOLDER SERVE_ARGS...: `quantem-gpu serve` in the
# background on an ephemeral port, its log in $work/NAME.log; sets daemon_pid
# and daemon_url once it listens. Returns 1 (recorded) when it does not start.
start_daemon() {
  local name=$1 data=$2
  shift 2
  local port_file=$work/$name.port
  if [ "$dry_run" = 1 ]; then
    echo "  $name (background): $(quoted "$bin" serve "$data" "$@" --port 0 --port-file "$port_file")"
    daemon_pid=0
    daemon_url="http://127.0.0.1:PORT"
    return 0
  fi
  rm -f "$port_file"
  LD_LIBRARY_PATH="$bundle/lib" "$bin" serve "$data" "$@" --port 0 --port-file "$port_file" > "$work/$name.log" 2>&1 &
  daemon_pid=$!
  local _
  for _ in $(seq 1 600); do
    [ -s "$port_file" ] && break
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -s "$port_file" ]; then
    daemon_url="http://127.0.0.1:$(cat "$port_file")"
    record "$name" 0 0 0 "" "$(quoted serve "$data" "$@")"
    return 0
  fi
  record "$name" 1 0 0 "" "$(quoted serve "$data" "$@")"
  echo "  $name did not start:"
  tail -n 5 "$work/$name.log" | sed 's/^/    | /'
  stop_daemon
  return 1
}

stop_daemon() {
  [ "$dry_run" = 1 ] && return 0
  [ -n "${daemon_pid:-}" ] && [ "$daemon_pid" != 0 ] || return 0
  kill "$daemon_pid" 2>/dev/null
  wait "$daemon_pid" 2>/dev/null
  daemon_pid=0
}

# The device's used memory, for the logs (nothing without nvidia-smi).
device_memory_used() {
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=memory.used --format=csv,noheader | tr '\n' ' '
}

# Nsight Compute's command line program, where the machine has it.
find_ncu() {
  command -v ncu || find /opt/nvidia/nsight-compute /usr/local/cuda/bin -maxdepth 2 -name ncu -type f 2>/dev/null | head -1
}

find_sanitizer() {
  command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer
}
