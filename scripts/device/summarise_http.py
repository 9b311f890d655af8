#!/usr/bin/env python3
"""One line per row of a bench_http_viewer JSON: client p50/min and the
daemon's server-timing stages (p50), then the cold starts and the first BF
requests on a ready daemon.

    summarise_http.py HTTP_JSON
"""
import json
import sys

r = json.load(open(sys.argv[1]))
for row in r["rows"]:
    c, s = row["client_ms"], row["server_ms"]
    print("%-34s p50 %.3f min %.3f | %s" % (row["name"], c["p50"], c["min"],
          " ".join("%s=%s" % (k, v.get("p50")) for k, v in s.items())))
for cold in r.get("cold_start", []):
    print("cold %.3f s first %.3f s | %s" % (cold["start_to_first_bf_body_s"],
          cold["first_bf_request_including_load_s"], cold["first_bf_server_timing"]))
for first in r.get("first_bf_on_a_ready_daemon", []):
    print("first BF on a ready daemon %.3f s | %s" % (first["first_bf_request_including_load_s"], first["server_timing"]))
