#!/usr/bin/env bash
# Load benchmark: wrk with 64 connections over the viewer's
# mixed routes against `serve BACKEND_ARGS`, then the bodies of a sample of
# routes fetched again one by one and compared byte for byte with the same
# requests made before the load (cached and uncached answers must agree).
# Prints one JSON line. Not a test: timings depend on the machine.
#
#   scripts/bench-wrk.sh BUILD_DIR [SECONDS] [-- serve arguments, default --backend cpu]
set -euo pipefail
command -v "${WRK:-wrk}" >/dev/null || { echo "bench-wrk: needs wrk (apt-get install wrk)" >&2; exit 2; }
build=${1:?build folder}
seconds=${2:-60}
shift 2 || shift $#
[[ "${1:-}" == "--" ]] && shift
serve_args=("$@")
[[ ${#serve_args[@]} -eq 0 ]] && serve_args=(--backend cpu)
bin="${QUANTEM_BIN:-$build/src/cli/quantem-gpu}"
wrk_bin="${WRK:-wrk}"
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
"$bin" synth "$work/data/sess" --prefix a --scan 64x64 --detector 64x64 --threads 2 >/dev/null
"$bin" serve "$work/data" "${serve_args[@]}" --port 0 --port-file "$work/port" --http-threads 16 2>"$work/serve.log" &
pid=$!
for _ in $(seq 300); do [[ -s "$work/port" ]] && curl -fs "http://127.0.0.1:$(cat "$work/port")/api/health/ready" >/dev/null && break; sleep 0.1; done
base="http://127.0.0.1:$(cat "$work/port")"
source="session=sess&file=a_master.h5"
samples=("/api/browse/realspace?$source&mode=BF&inner=0&outer=1.0300000"
         "/api/browse/realspace?$source&mode=ADF&inner=1&outer=3.0500000"
         "/api/browse/cbed?$source&sx=7&sy=5"
         "/api/browse/cbed-region?$source&cx=6&cy=6&radius=3&reduce=mean"
         "/api/browse/realspace?$source&mode=CoMx")
for i in "${!samples[@]}"; do curl -fsS "$base${samples[$i]}" -o "$work/before_$i"; done
rss_before=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
result=$(SOURCE="$source" "$wrk_bin" -t 4 -c 64 -d "${seconds}s" --latency -s "$(dirname "$0")/../tests/bench/wrk/mixed_routes.lua" "$base" |
         grep '^{')
mismatches=0
for i in "${!samples[@]}"; do
  curl -fsS "$base${samples[$i]}" -o "$work/after_$i"
  cmp -s "$work/before_$i" "$work/after_$i" || mismatches=$((mismatches + 1))
done
rss_after=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
printf '%s\n' "${result%\}}, \"sampled_bodies\": ${#samples[@]}, \"body_mismatches\": $mismatches, \"rss_kib_before\": $rss_before, \"rss_kib_after\": $rss_after, \"serve\": \"${serve_args[*]}\"}"
