#!/usr/bin/env python3
"""Markdown table of the viewer benchmark (bench_http_viewer JSON) with the
dense peer of each product (bench_dense_peers JSON, or the bench-kernels.json
of scripts/device/run.sh that holds it) and the request-path goals (ms, p50).

    request_path_table.py HTTP_JSON [DENSE_JSON] [LOOPBACK_FLOOR_JSON]
"""
import json
import sys

GOALS = {
    "BF": 1.0, "ABF": 1.2, "ADF": 2.0, "annulus shape": 2.0, "BF scan_bin 2": 0.8,
    "CoMx (computed plan)": 0.8, "CoMy (computed plan)": 0.8, "iCoM": 2.0,
    "BF fresh plan (new crop)": 3.0, "CoMx fresh plan (new crop)": 4.0, "cbed new position": 0.3,
    "cbed-region mean r=5": 0.5, "BF again (image-cache hit)": 0.3, "BF If-None-Match (304)": 0.2,
    "products BF+ABF+ADF+CoMx+CoMy+iCoM, one request": 1.5,
}


def dense_products(path):
    doc = json.load(open(path))
    if "products" in doc:
        return doc["products"]
    for step in doc.get("steps", []):  # a suite JSON of scripts/device/run.sh
        if isinstance(step.get("result"), dict) and "products" in step["result"]:
            return step["result"]["products"]
    return {}


def main():
    http = json.load(open(sys.argv[1]))
    dense = dense_products(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else {}
    floor = json.load(open(sys.argv[3])) if len(sys.argv) > 3 and sys.argv[3] else {}
    print("| request | p50 (p90, min) ms | in the daemon: total / compute / encode | dense peer: kernel / host ms "
          "| p50 ÷ dense host | goal |")
    print("|---|---|---|---|---|---|")
    for row in http["rows"]:
        name, c, s = row["name"], row["client_ms"], row["server_ms"]
        stage = lambda k: ("%.2f" % s[k]["p50"]) if k in s else "—"
        peer = dense.get(name)
        peer_text = "%.3f / %.3f" % (peer["kernel_ms"], peer["host_ms"]) if peer else "—"
        ratio = "%.2f" % (c["p50"] / peer["host_ms"]) if peer and peer["host_ms"] > 0 else "—"
        goal = GOALS.get(name)
        met = "" if goal is None else (" ✓" if c["p50"] <= goal else "")
        print("| %s | %.3f (%.3f, %.3f) | %s / %s / %s | %s | %s | %s |" % (
            name, c["p50"], c["p90"], c["min"], stage("total"), stage("compute"), stage("encode"), peer_text, ratio,
            ("≤ %g%s" % (goal, met)) if goal is not None else ""))
    for cold in http.get("cold_start", []):
        print("\ncold: start → first BF body %.3f s; first BF request including the load %.3f s (%s)" % (
            cold["start_to_first_bf_body_s"], cold["first_bf_request_including_load_s"], cold["first_bf_server_timing"]))
    for first in http.get("first_bf_on_a_ready_daemon", []):
        print("first BF request on a ready daemon (acquisition evicted first), load included: %.3f s (%s)" % (
            first["first_bf_request_including_load_s"], first["server_timing"]))
    for size, f in floor.items():
        print("loopback floor for a %s-byte body: p50 %.3f ms (min %.3f)" % (size, f["p50"], f["min"]))


main()
