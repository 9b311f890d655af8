#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, over the bundle made by
# scripts/device/build-bundle.sh: the backend suites and benchmarks
# (run-backend.sh MODE) and the codec suites and benchmarks (run.sh MODE) in
# one call, each into its own folder, returned as two archives (the device
# returns at most 8 files) plus both summaries.
#
#   bash scripts/device/run-all.sh [bench|quick|large]
set -uo pipefail
mode=${1:-bench}
out=${OUT:-/tmp/quantem-device-out}
mkdir -p "$out/backend" "$out/codec"
OUT="$out/backend" timeout 330 bash scripts/device/run-backend.sh "$mode"
echo "run-backend.sh rc=$?"
OUT="$out/codec" timeout 200 bash scripts/device/run.sh "$([ "$mode" = large ] && echo large || echo "")"
echo "run.sh rc=$?"
cp "$out/backend/summary.txt" "$out/summary_backend.txt"
cp "$out/codec/summary.txt" "$out/summary_codec.txt"
tar -C "$out" -czf "$out/backend.tar.gz" backend && rm -rf "$out/backend"
tar -C "$out" -czf "$out/codec.tar.gz" codec && rm -rf "$out/codec"
echo "== backend"; cat "$out/summary_backend.txt"
echo "== codec"; cat "$out/summary_codec.txt"
