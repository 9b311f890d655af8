#!/usr/bin/env bash
# Runs on the GPU machine over the bundle: (1) 200 load/evict cycles of a
# 512x512x192x192 u16 acquisition through HTTP against serve --gpus auto, with
# device memory and daemon RSS sampled (issue 13 item 4); (2) the
# 1024x1024x192x192 u16 load in-process (cuda_backend_bench): admitted,
# largest reservation and measured peak (issue 11's table).
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
data=/tmp/soak
rm -rf "$data" && mkdir -p "$data/tilt0"
"$bin" synth "$data/tilt0" --prefix tilt --scan 512x512 --detector 192x192 --dtype uint16 --preset realistic \
  --threads "$threads" > /dev/null 2>&1
cat "$data"/tilt0/* > /dev/null
note "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ) device used before the daemon: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
"$bin" serve "$data" --gpus auto --port 0 --port-file "$data/port" > "$out/serve_soak.log" 2>&1 &
pid=$!
for i in $(seq 1 300); do [ -s "$data/port" ] && break; sleep 0.1; done
timeout 240 python3 scripts/device/soak_cycles.py "http://127.0.0.1:$(cat "$data/port")" tilt0 tilt_master.h5 "$pid" 200 \
  --json "$out/soak.json" 2>&1 | tee -a "$summary"
kill "$pid"; wait "$pid" 2>/dev/null
note "device used after the daemon exited: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader)"
rm -rf "$data"
mkdir -p /tmp/large
"$bin" synth /tmp/large --prefix large --scan 1024x1024 --detector 192x192 --dtype uint16 --preset realistic \
  --threads "$threads" > /dev/null 2>&1
note "synth 1024x1024 rc=$?"
timeout 150 "$bundle/cuda_backend_bench" /tmp/large/large_master.h5 --repeats 1 --json "$out/bench_load_u16_1024.json" \
  > /dev/null 2>> "$out/serve_soak.log"
note "bench 1024 rc=$?"
python3 -c "
import json; r = json.load(open('$out/bench_load_u16_1024.json'))
print('1024^2 load %.3f s admitted %d reserved %d measured %d allocated %d resident %d bound %d' % (r['load_seconds_median'],
  r['admitted_peak_bytes'], r['reserved_peak_bytes'], r['measured_peak_bytes_cudaMemGetInfo'], r['allocated_peak_bytes'],
  r['resident_bytes'], r['bound_peak_bytes']))" | tee -a "$summary"
