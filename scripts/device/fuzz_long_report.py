#!/usr/bin/env python3
"""Sums a long libFuzzer run (scripts/device/run.sh fuzz-long): per target, the
executions over its jobs (each job's final stats, else its last status line),
the logs that report a crash, leak or undefined behaviour, and the crashing
inputs left as artifacts. Exit 1 when any target crashed.

  fuzz_long_report.py WORK_DIR SECONDS --json OUT TARGET...
"""
import glob
import json
import os
import re
import sys


def main():
    args = sys.argv[1:]
    out = args.pop(args.index("--json") + 1)
    args.remove("--json")
    work, seconds, targets = args[0], int(args[1]), args[2:]
    report = {}
    for target in targets:
        executions, jobs, crashes = 0, 0, []
        for log in sorted(glob.glob(os.path.join(work, "logs", target, "fuzz-*.log"))):
            text = open(log, errors="replace").read()
            jobs += 1
            final = re.findall(r"stat::number_of_executed_units: (\d+)", text)
            if final:
                executions += int(final[-1])
            else:  # stopped before the final stats: the last status line
                lines = re.findall(r"^#(\d+)\s", text, re.M)
                executions += int(lines[-1]) if lines else 0
            if re.search(r"ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)|runtime error:",
                         text):
                crashes.append(os.path.basename(log))
        artifact_dir = os.path.join(work, "artifacts", target)
        artifacts = os.listdir(artifact_dir) if os.path.isdir(artifact_dir) else []
        report[target] = {"executions": executions, "jobs": jobs, "seconds": seconds,
                          "crashing_logs": crashes, "artifacts": artifacts}
        print("%-16s %12d executions in %d jobs x %d s; crashes %d; artifacts %d" % (
            target, executions, jobs, seconds, len(crashes), len(artifacts)))
    json.dump(report, open(out, "w"), indent=1)
    return 1 if any(r["crashing_logs"] or r["artifacts"] for r in report.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
