#!/usr/bin/env python3
"""An acquisition that cannot fit the device budget, against a running
`serve --gpus auto --device-budget 2GB`: POST /load is refused with 413 before
any allocation, every time, and quickly. JSON with the status, the refusal's
text and the client's times; exit 1 unless every answer was 413.

  admission_refusal.py BASE_URL SESSION FILE [--repeats N] --json OUT
"""
import json
import sys
import time

sys.path.insert(0, __import__("os").path.dirname(__file__))
from e2e_compare import fetch, wait_ready  # noqa: E402


def main():
    base, session, name = sys.argv[1], sys.argv[2], sys.argv[3]
    repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 20
    out = sys.argv[sys.argv.index("--json") + 1]
    wait_ready(base)
    statuses, times_ms = [], []
    headers, body = {}, b""
    for _ in range(repeats):
        start = time.perf_counter()
        status, headers, body = fetch(base, f"/api/browse/load?session={session}&file={name}", method="POST")
        times_ms.append((time.perf_counter() - start) * 1000)
        statuses.append(status)
    times_ms.sort()
    report = {"all_413": all(s == 413 for s in statuses), "statuses": sorted(set(statuses)),
              "p50_ms": times_ms[len(times_ms) // 2], "min_ms": times_ms[0],
              "server_timing": headers.get("server-timing"), "detail": body[:300].decode(errors="replace")}
    json.dump(report, open(out, "w"), indent=1)
    print("413 under the budget:", report["all_413"], "p50 %.3f ms min %.3f ms" % (report["p50_ms"], report["min_ms"]),
          report["detail"][:200])
    return 0 if report["all_413"] else 1


if __name__ == "__main__":
    sys.exit(main())
