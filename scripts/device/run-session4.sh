#!/usr/bin/env bash
# Runs on the GPU machine over the bundle (scripts/device/build-bundle.sh):
#   1. run-backend.sh bench: every GPU suite, compute-sanitizer, serve --gpus auto
#      vs --backend cpu, load benchmarks (reserved vs measured peaks);
#   2. the viewer's request path through HTTP (tests/bench/bench_http_viewer,
#      issue 10) against serve --gpus auto on a synth 512x512x192x192 u16
#      realistic acquisition, cold start included;
#   3. issue 11's admission proof with the users' budget (--device-budget
#      52.2GB): the 1024x1024 acquisition, then seven 512x512 tilts beside it;
#      an acquisition that cannot fit a 2 GB budget refused with 413.
# Results: $OUT/*.json, summary.txt, backend.tar.gz.
#
#   bash scripts/device/run-session4.sh [all|request-path]   (request-path: steps 1 and 2, and bench_gpu_codec)
set -uo pipefail
bundle=$(pwd)/.bundle
out=${OUT:-/tmp/quantem-device-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
threads=$(nproc)
bin="$bundle/quantem-gpu"

mkdir -p "$out/backend"
OUT="$out/backend" timeout 300 bash scripts/device/run-backend.sh bench > /dev/null 2>&1
note "run-backend.sh bench rc=$?"
cat "$out/backend/summary.txt" >> "$summary"
tar -C "$out" -czf "$out/backend.tar.gz" backend && rm -rf "$out/backend"

data=/tmp/q
rm -rf "$data" /tmp/qv && mkdir -p "$data/tilt0" /tmp/qv
start=$(date +%s)
"$bin" synth "$data/tilt0" --prefix tilt --scan 512x512 --detector 192x192 --dtype uint16 --preset realistic \
  --threads "$threads" > /dev/null 2>&1
note "synth 512x512x192x192 u16 rc=$? ($(( $(date +%s) - start )) s)"
cp -al "$data/tilt0" /tmp/qv/tilt0
cat "$data"/tilt0/* > /dev/null  # page cache warm

# 2. The request path as a viewer sees it.
timeout 240 "$bundle/bench_http_viewer" --start-daemon "$bin" --data /tmp/qv --session tilt0 --file tilt_master.h5 \
  --daemon-arg=--gpus --daemon-arg=auto --cold-starts 3 --requests 40 > "$out/http_viewer.json" 2> "$out/http_viewer.log"
note "bench_http_viewer rc=$?"
python3 - "$out/http_viewer.json" <<'PY' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1]))
for row in r["rows"]:
    c, s = row["client_ms"], row["server_ms"]
    print("%-28s %s p50 %.3f p90 %.3f min %.3f | server total %s compute %s encode %s" % (
        row["name"], row["status"], c["p50"], c["p90"], c["min"], s.get("total", {}).get("p50"),
        s.get("compute", {}).get("p50"), s.get("encode", {}).get("p50")))
for cold in r.get("cold_start", []):
    print("cold: start->first BF body %.3f s, first BF incl. load %.3f s | %s" % (
        cold["start_to_first_bf_body_s"], cold["first_bf_request_including_load_s"], cold["first_bf_server_timing"]))
PY

if [ "${1:-all}" = "request-path" ]; then
  "$bundle/bench_gpu_codec" --json "$out/bench_gpu_codec.json" > /dev/null 2>> "$out/http_viewer.log"
  note "bench_gpu_codec rc=$?"
  python3 -c "import json; r = json.load(open('$out/bench_gpu_codec.json')); m = r['masked_sum']; print('masked sum kernel: ans', m.get('ans_ms_median'), 'ms, dense', m.get('dense_ms_median'), 'ms, identical', m.get('sums_identical'))" | tee -a "$summary"
  exit 0
fi

# 3. Admission with the users' budget.
start=$(date +%s)
mkdir -p "$data/big"
"$bin" synth "$data/big" --prefix big --scan 1024x1024 --detector 192x192 --dtype uint16 --preset realistic \
  --threads "$threads" > /dev/null 2>&1
note "synth 1024x1024x192x192 u16 rc=$? ($(( $(date +%s) - start )) s)"
for i in 1 2 3 4 5 6; do cp -al "$data/tilt0" "$data/tilt$i"; done
cat "$data"/big/* > /dev/null
"$bin" serve "$data" --gpus auto --device-budget 52.2GB --port 0 --port-file "$data/port" > "$out/serve_admission.log" 2>&1 &
pid=$!
for i in $(seq 1 600); do [ -s "$data/port" ] && break; sleep 0.1; done
timeout 200 python3 scripts/device/admission_proof.py "http://127.0.0.1:$(cat "$data/port")" big \
  tilt0,tilt1,tilt2,tilt3,tilt4,tilt5,tilt6 --json "$out/admission_proof.json" 2>&1 | tee -a "$summary"
note "admission proof rc=${PIPESTATUS[0]}"
kill "$pid"; wait "$pid" 2>/dev/null
# An acquisition that cannot fit: 512x512 under a 2 GB budget, refused before any allocation.
"$bin" serve /tmp/qv --gpus auto --device-budget 2GB --port 0 --port-file /tmp/qv/port > "$out/serve_small.log" 2>&1 &
pid=$!
for i in $(seq 1 300); do [ -s /tmp/qv/port ] && break; sleep 0.1; done
python3 - "http://127.0.0.1:$(cat /tmp/qv/port)" <<'PY' | tee -a "$summary"
import sys, time, urllib.request, urllib.error
sys.path.insert(0, "scripts/device")
from e2e_compare import fetch, wait_ready
base = sys.argv[1]
wait_ready(base)
times = []
for i in range(20):
    t = time.perf_counter()
    status, headers, body = fetch(base, "/api/browse/load?session=tilt0&file=tilt_master.h5", method="POST")
    times.append((time.perf_counter() - t) * 1000)
times.sort()
print("413 under 2GB budget: status", status, "p50 %.3f ms min %.3f ms" % (times[len(times) // 2], times[0]),
      "server-timing", headers.get("server-timing"), body[:200])
PY
kill "$pid"; wait "$pid" 2>/dev/null
nvidia-smi --query-gpu=memory.used --format=csv,noheader | tee -a "$summary"
