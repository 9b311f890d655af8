#!/usr/bin/env bash
# A long libFuzzer run on the GPU machine's CPU cores (issue 13: >= 10 M
# executions per target, 0 crashes), over .fuzzbundle
# (scripts/device/build-fuzz-bundle.sh). Each target runs JOBS parallel
# processes on one shared corpus (libFuzzer -jobs/-workers) for SECONDS, with
# the limits of tests/fuzz/run_fuzzers.sh. Writes $OUT/fuzz_long.json (per
# target: executions summed over its jobs, crashes, seconds), the job logs'
# last lines, any crashing input under $OUT/artifacts/, and the grown corpora
# as $OUT/corpus.tar.gz.
#
#   bash scripts/device/run-fuzz-long.sh SECONDS JOBS TARGET...
set -uo pipefail
bundle=$(pwd)/.fuzzbundle
out=${OUT:-/tmp/quantem-fuzz-out}
seconds=${1:?SECONDS}
jobs=${2:?JOBS}
shift 2
mkdir -p "$out/artifacts"
export LSAN_OPTIONS="suppressions=$bundle/lsan_suppressions.txt"
echo "commit $(cat "$bundle/COMMIT") $(date -u +%FT%TZ) cores $(nproc)"
for target in "$@"; do
  corpus="$bundle/corpus/$target"
  mkdir -p "$corpus" "$out/artifacts/$target" "$out/logs/$target"
  corpora=("$corpus" "$bundle/seeds/$target")
  [ -d "$bundle/regressions/$target" ] && corpora+=("$bundle/regressions/$target")
  (cd "$out/logs/$target" && LD_LIBRARY_PATH="$bundle/lib" "$bundle/fuzz_$target" -jobs="$jobs" -workers="$jobs" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/$target/" "${corpora[@]}" > /dev/null 2>&1) &
done
wait
python3 - "$out" "$seconds" "$@" <<'PY'
import glob, json, os, re, sys
out, seconds, targets = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
report = {}
for target in targets:
    executions, jobs, crashes = 0, 0, []
    for log in sorted(glob.glob(os.path.join(out, "logs", target, "fuzz-*.log"))):
        text = open(log, errors="replace").read()
        jobs += 1
        m = re.findall(r"stat::number_of_executed_units: (\d+)", text)
        if m:
            executions += int(m[-1])
        else:  # killed before the final stats: the last status line
            lines = re.findall(r"^#(\d+)\s", text, re.M)
            executions += int(lines[-1]) if lines else 0
        if re.search(r"ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)|runtime error:", text):
            crashes.append(os.path.basename(log))
    artifacts = os.listdir(os.path.join(out, "artifacts", target))
    report[target] = {"executions": executions, "jobs": jobs, "seconds": seconds,
                      "crashing_logs": crashes, "artifacts": artifacts}
    print("%-16s %12d executions in %d jobs x %d s; crashes %d; artifacts %d" % (
        target, executions, jobs, seconds, len(crashes), len(artifacts)))
json.dump(report, open(os.path.join(out, "fuzz_long.json"), "w"), indent=1)
PY
tar -C "$bundle" -czf "$out/corpus.tar.gz" corpus
