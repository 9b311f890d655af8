#!/usr/bin/env bash
# Quick start 1: install, build, synthesize a demo acquisition and serve it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DQUANTEM_BUILD_TESTS=OFF >/dev/null
cmake --build build --target quantem-gpu
demo="${QUANTEM_DEMO_DIR:-$PWD/demo-data}"
if [[ ! -f "$demo/demo/session_001/demo_master.h5" ]]; then
  mkdir -p "$demo/demo/session_001"
  build/src/cli/quantem-gpu synth "$demo/demo/session_001" --prefix demo --scan 64x48 --detector 96x96 --preset realistic
fi
build/src/cli/quantem-gpu catalog "$demo"
