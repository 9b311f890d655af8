#!/usr/bin/env python3
"""Checks a bundle made by scripts/device/build-bundle.sh before anything runs from it:
its commit, each binary and whether the dynamic loader finds every library it
needs (with the bundle's lib/ first, as the suites run them), and the data
the GPU tests read. JSON on stdout; exit 1 when a binary lacks a library or
the bundle holds no binary.

  check_bundle.py BUNDLE_DIR
"""
import json
import os
import subprocess
import sys


def main():
    bundle = sys.argv[1]
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(bundle, "lib"))
    report = {"bundle": bundle, "binaries": {}, "missing_libraries": {}}
    commit_file = os.path.join(bundle, "COMMIT")
    report["commit"] = open(commit_file).read().strip() if os.path.exists(commit_file) else None
    for name in sorted(os.listdir(bundle)):
        path = os.path.join(bundle, name)
        if not os.path.isfile(path) or not os.access(path, os.X_OK):
            continue
        report["binaries"][name] = os.path.getsize(path)
        ldd = subprocess.run(["ldd", path], capture_output=True, text=True, env=env).stdout
        missing = [line.split()[0] for line in ldd.splitlines() if "not found" in line]
        if missing:
            report["missing_libraries"][name] = missing
    for folder in ("data/real", "data/fixtures"):
        root = os.path.join(bundle, folder)
        report[folder.replace("/", "_") + "_files"] = sum(len(files) for _, _, files in os.walk(root))
    report["ok"] = bool(report["binaries"]) and not report["missing_libraries"]
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
