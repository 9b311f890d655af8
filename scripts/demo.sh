#!/usr/bin/env bash
# Quick start 1: install the dependencies, build, synthesize a demo acquisition
# and serve it on 127.0.0.1:${QUANTEM_PORT:-8780} until Ctrl-C.
# Uses the CUDA backend when this build has CUDA and a GPU is visible, else the
# explicit CPU backend (never a silent fallback inside the daemon).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DQUANTEM_BUILD_TESTS=OFF >/dev/null
cmake --build build --target quantem-gpu
bin=build/src/cli/quantem-gpu
port="${QUANTEM_PORT:-8780}"
demo="${QUANTEM_DEMO_DIR:-$PWD/demo-data}"
session="$demo/demo/20261202_session"
if [[ ! -f "$session/demo_master.h5" ]]; then
  mkdir -p "$session"
  "$bin" synth "$session" --prefix demo --scan 64x48 --detector 96x96 --preset realistic >&2
fi
backend=(--backend cpu)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && grep -q "^CMAKE_CUDA_COMPILER:FILEPATH=/" build/CMakeCache.txt 2>/dev/null; then
  backend=(--gpus auto)
fi
cat >&2 <<MSG
Serving $demo on http://127.0.0.1:$port (${backend[*]}); press Ctrl-C to stop.
Open the viewer: http://127.0.0.1:$port/
  (from another machine: ssh -L $port:localhost:$port THIS_HOST, then the same URL; docs/viewer.md)
Or try:
  curl -s http://127.0.0.1:$port/api/browse/sessions
  curl -s -D - -o bf.u4 'http://127.0.0.1:$port/api/browse/realspace?session=demo/20261202_session&file=demo_master.h5&mode=BF'
  curl -s 'http://127.0.0.1:$port/api/browse/realspace?session=demo/20261202_session&file=demo_master.h5&mode=CoMx&format=npy' \\
    | python3 -c 'import sys, io, numpy; a = numpy.load(io.BytesIO(sys.stdin.buffer.read())); print(a.shape, a.dtype, a.mean())'
MSG
exec "$bin" serve "$demo" "${backend[@]}" --port "$port"
