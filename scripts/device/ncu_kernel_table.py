"""ncu --csv --print-units base output of a benchmark run -> JSON tables of kernel time.

    python3 ncu_kernel_table.py NCU_CSV LOADS             # ms and launches per load, by kernel
    python3 ncu_kernel_table.py NCU_CSV 1 --by-grid       # median us per launch, by kernel and grid size

The first form reads gpu__time_duration.sum of every kernel of LOADS loads
(where a load's time goes); the second also reads launch__grid_size, since one
kernel's cost depends on its grid (a frame's accumulate_frames has one job
row, a half crop's hundreds).
"""
import collections
import csv
import json
import statistics
import sys

NOISE = ("void ", "quantem::", "kernels::", "(anonymous namespace)::")


def short_name(kernel):
    name = kernel.split("(")[0]
    for noise in NOISE:
        name = name.replace(noise, "")
    return name


def rows_of(path):
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    head = rows[0]
    return head, [r for r in rows[1:] if r[head.index("Kernel Name")] != "Kernel Name"]


def per_load(path, loads):
    head, rows = rows_of(path)
    k, m, v = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    by = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        if r[m] != "gpu__time_duration.sum":
            continue
        name = short_name(r[k])
        by[name][0] += 1
        by[name][1] += float(r[v].replace(",", "")) / 1e6  # ns -> ms
    table = {n: {"launches_per_load": c / loads, "ms_per_load": round(t / loads, 3)}
             for n, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])}
    table["_total_ms_per_load"] = round(sum(t for _, t in by.values()) / loads, 3)
    return table


def by_grid(path):
    head, rows = rows_of(path)
    i_id, k, m, v = head.index("ID"), head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    launches = collections.defaultdict(dict)
    for r in rows:
        launches[r[i_id]]["name"] = short_name(r[k]).split("<")[0]
        launches[r[i_id]][r[m]] = float(r[v].replace(",", ""))
    by = collections.defaultdict(list)
    for launch in launches.values():
        by[(launch["name"], int(launch.get("launch__grid_size", 0)))].append(
            launch.get("gpu__time_duration.sum", 0) / 1000.0)  # ns -> us
    return [{"kernel": name, "grid": grid, "launches": len(us), "us_median": round(statistics.median(us), 2)}
            for (name, grid), us in sorted(by.items())]


def main():
    path, loads = sys.argv[1], int(sys.argv[2])
    table = by_grid(path) if "--by-grid" in sys.argv[3:] else per_load(path, loads)
    print(json.dumps(table, indent=1))


main()
