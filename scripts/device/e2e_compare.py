#!/usr/bin/env python3
"""End-to-end check on a GPU machine: the same requests to `quantem-gpu serve
--gpus auto` (CUDA backend) and `quantem-gpu serve --backend cpu` over the same
data folder must give identical count payloads (byte for byte) and float
payloads (CoM) within 1e-5. Standard library + numpy only.

  e2e_compare.py GPU_URL CPU_URL SESSION[,SESSION...] [--json OUT]
Each SESSION is a folder holding SESSION_master.h5 (as `quantem-gpu synth
--prefix SESSION` writes it).
"""
import json
import sys
import time
import urllib.error
import urllib.request

import numpy as np


def fetch(base, path, method="GET"):
    request = urllib.request.Request(base + path, method=method)
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def wait_ready(base, seconds=180):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if fetch(base, "/api/health/ready")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{base} not ready after {seconds} s")


def load(base, query):
    start = time.time()
    status, _, body = fetch(base, "/api/browse/load?" + query, method="POST")
    if status not in (200, 202):
        raise SystemExit(f"load {base} {query}: {status} {body[:300]!r}")
    while True:
        status, _, body = fetch(base, "/api/browse/residency?" + query)
        doc = json.loads(body)
        if doc["state"] == "resident":
            return doc, time.time() - start
        if doc["state"] == "failed":
            raise SystemExit(f"load failed on {base}: {doc}")
        time.sleep(0.02)


REQUESTS = [
    "/api/browse/realspace?{q}&mode=BF",
    "/api/browse/realspace?{q}&mode=ABF",
    "/api/browse/realspace?{q}&mode=ADF&inner=1&outer=3",
    "/api/browse/realspace?{q}&mode=CoMx",
    "/api/browse/realspace?{q}&mode=CoMy",
    "/api/browse/realspace?{q}&mode=BF&scan_bin=2&det_bin=2&row_start=1&row_stop=30&column_start=3&column_stop=31",
    "/api/browse/realspace?{q}&mode=CoMx&scan_bin=3&det_bin=4",
    "/api/browse/realspace-shape?{q}&shape=annulus&cx=96&cy=96&inner=10&outer=40",
    "/api/browse/cbed?{q}&sx=3&sy=5",
    "/api/browse/cbed?{q}&sx=7&sy=2&scan_bin=2&det_bin=3",
    "/api/browse/cbed-region?{q}&cx=10&cy=8&radius=4&reduce=mean",
    "/api/browse/cbed-region?{q}&cx=10&cy=8&radius=4&reduce=max",
    "/api/browse/cbed-region?{q}&cx=12&cy=12&radius=5&reduce=max&scan_bin=2&det_bin=2",
]


def main():
    gpu, cpu, sessions = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    wait_ready(gpu)
    wait_ready(cpu)
    report = {"capabilities": {}, "sessions": {}, "mismatches": 0}
    for name, base in (("gpu", gpu), ("cpu", cpu)):
        caps = json.loads(fetch(base, "/api/browse/capabilities")[2])
        report["capabilities"][name] = {"backend": caps.get("backend"), "devices": caps.get("devices")}
        print(name, "backend", caps.get("backend"), "devices",
              [(d.get("name"), d.get("cache_budget_bytes")) for d in caps.get("devices", [])])
    if report["capabilities"]["gpu"]["backend"] != "cuda":
        print("MISMATCH: the GPU daemon does not report backend cuda")
        report["mismatches"] += 1
    for session in sessions:
        query = f"session={session}&file={session}_master.h5"
        gpu_status, gpu_load_s = load(gpu, query)
        cpu_status, cpu_load_s = load(cpu, query)
        entry = {"gpu_residency": gpu_status, "cpu_residency": cpu_status,
                 "gpu_load_seconds_wall": gpu_load_s, "cpu_load_seconds_wall": cpu_load_s, "requests": []}
        print(session, "gpu", gpu_status["encoding"], gpu_status["resident_bytes"], f"{gpu_load_s:.3f} s",
              "| cpu", cpu_status["encoding"], cpu_status["resident_bytes"], f"{cpu_load_s:.3f} s")
        for template in REQUESTS:
            path = template.format(q=query)
            t0 = time.time()
            g_status, g_headers, g_body = fetch(gpu, path)
            t1 = time.time()
            c_status, c_headers, c_body = fetch(cpu, path)
            t2 = time.time()
            dtype = g_headers.get("x-dtype", "")
            result = {"path": path.split("?")[0] + "?" + path.split("&", 2)[-1], "status": [g_status, c_status],
                      "dtype": dtype, "gpu_ms": 1000 * (t1 - t0), "cpu_ms": 1000 * (t2 - t1)}
            ok = g_status == c_status
            if ok and g_status == 200:
                same_shape = (g_headers.get("x-width"), g_headers.get("x-height")) == \
                             (c_headers.get("x-width"), c_headers.get("x-height"))
                if "f4" in dtype or "float" in dtype:
                    a = np.frombuffer(g_body, dtype="<f4")
                    b = np.frombuffer(c_body, dtype="<f4")
                    diff = float(np.max(np.abs(a.astype(np.float64) - b))) if a.size == b.size and a.size else 0.0
                    result["max_abs_diff"] = diff
                    ok = same_shape and a.size == b.size and diff <= 1e-5 * max(1.0, float(np.max(np.abs(b))) if b.size else 1.0)
                else:
                    result["identical_bytes"] = g_body == c_body
                    ok = same_shape and g_body == c_body
                provenance = json.loads(g_headers.get("x-quantem-provenance", "{}"))
                result["gpu_provenance_backend"] = provenance.get("backend")
                result["gpu_resident_encoding"] = provenance.get("resident_encoding")
            elif ok:
                ok = g_body == c_body
            result["ok"] = ok
            if not ok:
                report["mismatches"] += 1
                print("MISMATCH", session, path, g_status, c_status, g_body[:200] if g_status != 200 else "")
            else:
                print("ok", session, result["path"][:90], dtype, f"gpu {result['gpu_ms']:.1f} ms cpu {result['cpu_ms']:.1f} ms")
            entry["requests"].append(result)
        report["sessions"][session] = entry
    print("mismatches", report["mismatches"])
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if report["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
