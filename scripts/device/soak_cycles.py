#!/usr/bin/env python3
"""Load/evict cycles through HTTP against a running `serve --gpus auto`: each cycle
POSTs /load, waits for "resident", DELETEs the resident. Samples the device's used
memory (nvidia-smi) and the daemon's resident set (/proc/PID/status) before, during
and after, to show memory comes back to its baseline. Exit 1 when a cycle failed.

  soak_cycles.py BASE_URL SESSION FILE DAEMON_PID CYCLES --json OUT
"""
import json
import subprocess
import sys
import time

sys.path.insert(0, __import__("os").path.dirname(__file__))
from e2e_compare import fetch, wait_ready  # noqa: E402


def device_used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0])


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def main():
    base, session, name, pid, cycles = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    out = sys.argv[sys.argv.index("--json") + 1]
    wait_ready(base)
    q = f"session={session}&file={name}"
    samples = [{"cycle": 0, "device_used_mib": device_used_mib(), "rss_kib": rss_kib(pid)}]
    seconds = []
    failures = 0
    for cycle in range(1, cycles + 1):
        start = time.time()
        status = fetch(base, "/api/browse/load?" + q, method="POST")[0]
        while status in (200, 202):
            doc = json.loads(fetch(base, "/api/browse/residency?" + q)[2])
            if doc["state"] in ("resident", "failed"):
                failures += doc["state"] == "failed"
                break
            time.sleep(0.002)
        if status not in (200, 202):
            failures += 1
        if fetch(base, "/api/browse/resident?" + q, method="DELETE")[0] != 200:
            failures += 1
        seconds.append(time.time() - start)
        if cycle in (1, 10, 50, 100, 150, cycles):
            time.sleep(0.2)
            samples.append({"cycle": cycle, "device_used_mib": device_used_mib(), "rss_kib": rss_kib(pid)})
    report = {"cycles": cycles, "failures": failures, "cycle_seconds_median": sorted(seconds)[len(seconds) // 2],
              "samples": samples}
    json.dump(report, open(out, "w"), indent=1)
    print("soak: %d cycles, %d failures, median cycle %.3f s" % (cycles, failures, report["cycle_seconds_median"]))
    for s in samples:
        print("  after cycle %d: device used %d MiB, daemon RSS %.1f MiB" % (s["cycle"], s["device_used_mib"],
                                                                            s["rss_kib"] / 1024))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
