"""ncu --page source --csv (CUDA lines) -> the hottest source lines of a kernel.

    python3 ncu_source_lines.py SOURCE_CSV [TOP]

Prints, for the TOP lines by instructions executed and by warp-stall samples,
the line's share of each and its text: where a kernel's instructions go.
"""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1], errors="replace")))
top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
head_at = next(i for i, r in enumerate(rows) if any("Source" == c.strip() or "Line" in c for c in r))
head = rows[head_at]
print("columns:", " | ".join(head))


def column(*needles):
    for i, name in enumerate(head):
        if all(n.lower() in name.lower() for n in needles):
            return i
    return None


source = column("source") if column("source") is not None else 1
line_no = column("#")
instr = column("instructions executed")
stall = column("warp stall sampling (all")
data = []
for r in rows[head_at + 1:]:
    if len(r) != len(head):
        continue

    def num(i):
        try:
            return float(r[i].replace(",", "")) if i is not None and r[i] else 0.0
        except ValueError:
            return 0.0

    data.append((num(instr), num(stall), r[line_no] if line_no is not None else "", r[source][:150]))
for label, key in (("instructions executed", 0), ("warp stall samples (all)", 1)):
    total = sum(d[key] for d in data) or 1.0
    print(f"== top {top} lines by {label} (total {total:.4g})")
    for d in sorted(data, key=lambda d: -d[key])[:top]:
        print(f"{100 * d[key] / total:6.2f}%  {100 * d[1 - key] / (sum(x[1 - key] for x in data) or 1):6.2f}%  "
              f"L{d[2]:>5}  {d[3].strip()}")
