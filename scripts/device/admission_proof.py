#!/usr/bin/env python3
"""Admission through HTTP, against a running `serve --gpus auto --device-budget ...`:
the 1024^2 acquisition admitted and loaded, then seven 512^2 tilts resident beside it,
with the reservations, resident bytes and budget of the device at each step. Exit 1
unless every acquisition ends resident at once.

  admission_proof.py BASE_URL BIG_SESSION TILT_SESSION[,TILT_SESSION...] --json OUT
"""
import json
import sys
import time

sys.path.insert(0, __import__("os").path.dirname(__file__))
from e2e_compare import fetch, wait_ready  # noqa: E402


def query(base, session):
    sessions = json.loads(fetch(base, "/api/browse/sessions")[2])
    for entry in sessions.get("sessions", []):
        if entry.get("path") == session and entry.get("files"):
            return f"session={session}&file={entry['files'][0]['name']}"
    raise SystemExit(f"session {session} not in the catalog: {json.dumps(sessions)[:400]}")


def load(base, q):
    start = time.time()
    status, headers, body = fetch(base, "/api/browse/load?" + q, method="POST")
    if status not in (200, 202):
        return {"status": status, "detail": body[:400].decode(errors="replace")}, time.time() - start
    peak_reserved = 0
    while True:
        doc = json.loads(fetch(base, "/api/browse/residency?" + q)[2])
        peak_reserved = max(peak_reserved, doc.get("reserved_bytes") or 0)
        if doc["state"] in ("resident", "failed"):
            doc["peak_reserved_seen"] = peak_reserved
            return doc, time.time() - start
        time.sleep(0.005)


def device_usage(base):
    caps = json.loads(fetch(base, "/api/browse/capabilities")[2])
    return [{k: d.get(k) for k in ("index", "name", "cache_budget_bytes", "resident_bytes", "free_bytes",
                                   "resident_entries", "loading_bytes")} for d in caps.get("devices", [])]


def main():
    base, big, tilts = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    out = sys.argv[sys.argv.index("--json") + 1]
    wait_ready(base)
    report = {"steps": []}
    big_q = query(base, big)
    doc, seconds = load(base, big_q)
    report["steps"].append({"load": big, "seconds": seconds, "residency": doc, "devices": device_usage(base)})
    for tilt in tilts:
        doc, seconds = load(base, query(base, tilt))
        report["steps"].append({"load": tilt, "seconds": seconds, "residency": doc, "devices": device_usage(base)})
    states = {}
    for name in [big] + tilts:
        states[name] = json.loads(fetch(base, "/api/browse/residency?" + query(base, name))[2])["state"]
    report["final_states"] = states
    report["all_resident_together"] = all(s == "resident" for s in states.values())
    metrics = fetch(base, "/metrics")[2].decode()
    report["metrics"] = [line for line in metrics.splitlines()
                         if line.startswith(("quantem_reservation", "quantem_evictions", "quantem_admission",
                                             "quantem_resident_bytes", "quantem_device_budget"))]
    json.dump(report, open(out, "w"), indent=1)
    print("all resident together:", report["all_resident_together"], states)
    for step in report["steps"]:
        r = step["residency"]
        print(step["load"], "%.3f s" % step["seconds"], r.get("state"), "resident", r.get("resident_bytes"),
              "peak reserved seen", r.get("peak_reserved_seen"), "device resident",
              step["devices"][0].get("resident_bytes") if step["devices"] else None)
    return 0 if report["all_resident_together"] else 1


if __name__ == "__main__":
    sys.exit(main())
