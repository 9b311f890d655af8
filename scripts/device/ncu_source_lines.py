"""ncu --page source --csv --print-source cuda,sass -> the hottest CUDA lines of a kernel.

    python3 ncu_source_lines.py SOURCE_CSV[.gz] [TOP]

The export lists, per source file, each CUDA line (its metrics summed over
its SASS instructions, Address "-") followed by those instructions. This
prints the TOP lines by instructions executed, with their share of the
kernel's instructions and of its warp-stall samples: where a kernel's
instructions go.
"""
import collections
import csv
import gzip
import sys

path = sys.argv[1]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
opener = gzip.open if path.endswith(".gz") else open
lines = collections.defaultdict(lambda: [0.0, 0.0, ""])
file_name, head = "?", None
for row in csv.reader(opener(path, "rt", errors="replace")):
    if not row:
        continue
    if row[0] == "File Path":
        file_name = row[1].rsplit("/", 1)[-1]
        continue
    if row[0] == "Line No":
        head = row
        executed = head.index("Instructions Executed")
        stalls = head.index("Warp Stall Sampling (All Samples)")
        continue
    if head is None or row[0] in ("", "Function Name") or len(row) < len(head) or row[2] != "-":
        continue
    try:
        entry = lines[f"{file_name}:{row[0]}"]
        entry[0] += float(row[executed] or 0)
        entry[1] += float(row[stalls] or 0)
        entry[2] = row[1].strip()
    except ValueError:
        continue
total_executed = sum(v[0] for v in lines.values()) or 1.0
total_stalls = sum(v[1] for v in lines.values()) or 1.0
print(f"instructions executed {total_executed:.4g}, warp-stall samples {total_stalls:.4g}")
print("  instr%  stall%  line")
for name, (count, stall, text) in sorted(lines.items(), key=lambda kv: -kv[1][0])[:top]:
    print(f"{100 * count / total_executed:7.2f} {100 * stall / total_stalls:7.2f}  {name:30s} {text[:110]}")
