"""ncu --csv gpu__time_duration.sum of N loads -> JSON: ms per load and launches per load, by kernel.

    python3 ncu_kernel_table.py NCU_CSV LOADS
"""
import collections
import csv
import json
import sys

rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
loads = int(sys.argv[2])
head = rows[0]
k, m, v = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
by = collections.defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    if r[m] != "gpu__time_duration.sum":
        continue
    name = r[k].split("(")[0]
    for noise in ("void ", "quantem::", "cuda::", "(anonymous namespace)::"):
        name = name.replace(noise, "")
    by[name][0] += 1
    by[name][1] += float(r[v].replace(",", "")) / 1e6  # ns -> ms
table = {n: {"launches_per_load": c / loads, "ms_per_load": round(t / loads, 3)}
         for n, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])}
table["_total_ms_per_load"] = round(sum(t for _, t in by.values()) / loads, 3)
print(json.dumps(table, indent=1))
