#!/usr/bin/env python3
"""Turns one suite's step table (scripts/device/run.sh) into $OUT/<suite>.json and
prints its summary line: passed or failed, steps passed, seconds, and the
suite's headline figures. Each step keeps its command, exit status, time, the
gtest and compute-sanitizer counts found in its log, and the JSON its program
wrote (gtest reports condensed to counts and failed tests). Exit 1 when a step
failed or none ran.

  suite_report.py SUITE WORK_DIR OUT_JSON SECONDS COMMIT_FILE
"""
import datetime
import json
import os
import re
import subprocess
import sys


def read_json(path):
    """A JSON document, or a JSON-lines file as a list, or None."""
    try:
        text = open(path).read()
    except OSError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError:
            return None


def condensed(result):
    """gtest's JSON report as its counts and the names of failed tests."""
    if isinstance(result, dict) and "testsuites" in result and "tests" in result:
        failed = [f"{suite['name']}.{test['name']}" for suite in result["testsuites"]
                  for test in suite.get("testsuite", []) if test.get("failures")]
        return {key: result.get(key) for key in ("tests", "failures", "disabled", "errors", "time")} | {
            "failed_tests": failed}
    return result


def log_counts(path):
    counts = {}
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return counts
    errors = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", text)]
    if errors:
        counts["sanitizer_errors"] = sum(errors)
    leaks = re.findall(r"LEAK SUMMARY: (\d+) bytes leaked", text)
    if leaks:
        counts["sanitizer_leaked_bytes"] = sum(int(n) for n in leaks)
    passed = re.findall(r"^\[  PASSED  \] (\d+) test", text, re.M)
    failed = re.findall(r"^\[  FAILED  \] (\d+) test", text, re.M)
    if passed or failed:
        counts["gtest_passed"] = sum(int(n) for n in passed)
        counts["gtest_failed"] = sum(int(n) for n in failed)
    return counts


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def results(steps):
    return [(s["name"], s["result"]) for s in steps if s.get("result") is not None]


def headline(suite, steps):
    """The few figures a reader of the summary line wants first."""
    parts = []
    try:
        if suite in ("gpu-tests", "memcheck"):
            tests = sum((r.get("tests") or 0) for _, r in results(steps) if isinstance(r, dict))
            failures = sum((r.get("failures") or 0) for _, r in results(steps) if isinstance(r, dict))
            if tests:
                parts.append(f"{tests} tests, {failures} failures")
            errors = [s["sanitizer_errors"] for s in steps if "sanitizer_errors" in s]
            if errors:
                parts.append(f"{len(errors)} checks, {sum(errors)} sanitizer errors")
        for name, r in results(steps):
            if not isinstance(r, dict):
                continue
            if "mismatches" in r:
                parts.append(f"e2e mismatches {r['mismatches']}")
            if "load_seconds_median" in r:
                parts.append(f"{name} load {r['load_seconds_median']:.3f} s")
            if "rows" in r:
                bf = next((row for row in r["rows"] if row.get("name") == "BF"), None)
                parts.append(f"{name} BF p50 {bf['client_ms']['p50']:.3f} ms" if bf else f"{name} {len(r['rows'])} rows")
            if "bslz4_decode" in r:
                parts.append(f"{name} bslz4 {r['bslz4_decode']['decoded_GBps']:.0f} GB/s"
                             f" ans enc {r['ans_encode']['dense_GBps']:.0f} GB/s")
            if "products" in r:
                parts.append(f"{name} {len(r['products'])} dense peers")
            if "all_resident_together" in r:
                parts.append(f"all resident together {r['all_resident_together']}")
            if "all_413" in r:
                parts.append(f"413 refusal {r['all_413']}")
            if "cycles" in r and "failures" in r:
                parts.append(f"soak {r['cycles']} cycles, {r['failures']} failures")
            if "_total_ms_per_load" in r:
                parts.append(f"{name} {r['_total_ms_per_load']} ms of kernels per load")
            if "binaries" in r:
                parts.append(f"commit {str(r.get('commit'))[:10]}, {len(r['binaries'])} binaries")
            if suite == "fuzz-long":
                for target, t in r.items():
                    parts.append(f"{target} {t['executions']} runs {len(t['crashing_logs'])} crashes")
    except (KeyError, TypeError, ValueError) as error:  # a figure missing from a result: say so, keep the line
        parts.append(f"(headline incomplete: {error!r})")
    return "; ".join(parts)


def main():
    suite, work, out_json, seconds, commit_file = sys.argv[1:6]
    steps = []
    table = os.path.join(work, "steps.tsv")
    for line in open(table) if os.path.exists(table) else []:
        name, rc, step_seconds, expect_fail, json_file, command = line.rstrip("\n").split("\t", 5)
        rc = int(rc)
        passed = (rc != 0) if expect_fail == "1" else (rc == 0)
        step = {"name": name, "passed": passed, "rc": rc, "seconds": float(step_seconds), "command": command}
        if expect_fail == "1":
            step["expected_to_fail"] = True
        step |= log_counts(os.path.join(work, name + ".log"))
        if json_file:
            step["result"] = condensed(read_json(os.path.join(work, json_file)))
        steps.append(step)
    commit = open(commit_file).read().strip() if os.path.exists(commit_file) else None
    ok = bool(steps) and all(s["passed"] for s in steps)
    report = {"suite": suite, "ok": ok, "commit": commit,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "gpu": gpu_name(), "seconds": float(seconds), "steps": steps}
    report["headline"] = headline(suite, steps)
    with open(out_json, "w") as f:
        json.dump(report, f, indent=1)
    passed = sum(s["passed"] for s in steps)
    failed = [s["name"] for s in steps if not s["passed"]]
    print(f"{suite:<13} {'ok' if ok else 'FAILED':<6} {passed}/{len(steps)} steps {float(seconds):.0f} s"
          + (f" | failed: {', '.join(failed)}" if failed else "")
          + (f" | {report['headline']}" if report["headline"] else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
