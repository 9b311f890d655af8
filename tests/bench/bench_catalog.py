#!/usr/bin/env python3
"""The catalog of a large data folder, as an operator meets it: prints JSON.

Generates N small acquisitions (one `quantem-gpu synth` acquisition copied into
N session folders, one per folder), then against the real daemon (CPU backend):
  first build      start -> /api/health/ready with no catalog cache file
  restart          start -> ready again, nothing changed (the cache reused), and
                   start -> the watcher set up (it starts after the first build)
  refresh          GET /api/browse/sessions?refresh=true, nothing changed: at once
                   (the last build reused) and after the refresh interval (a build)
  new acquisition  a master renamed into place -> listed ready by
                   /api/browse/acquisitions (the viewer's poll), and the
                   refresh that then lists it in the sessions document
  poll 304         GET /api/browse/sessions with the last etag (median of 50)
  acquisitions     GET /api/browse/acquisitions of an unchanged folder (median of 5)
  sessions body    bytes plain and gzip, and the first GET's time
  rss              the daemon's VmRSS with every master catalogued
plus the build counts the daemon logs (masters reused / inspected).

  tests/bench/bench_catalog.py --binary build/src/cli/quantem-gpu --count 2000 \
      [--folder /tmp/catalog-bench] [--inspect-workers 0] [--keep]
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def generate(binary, folder, count):
    """N acquisitions: one synthesized, copied into session folders s00000, s00001, ..."""
    template = os.path.join(folder, "_template")
    if not os.path.exists(os.path.join(template, "acq_master.h5")):
        subprocess.run([binary, "synth", template, "--prefix", "acq", "--scan", "4x4", "--detector", "8x8",
                        "--threads", "1"], check=True, capture_output=True)
    files = sorted(os.listdir(template))
    made = 0
    for i in range(count):
        session = os.path.join(folder, "s%05d" % i)
        if os.path.exists(os.path.join(session, "acq_master.h5")):
            continue
        os.makedirs(session, exist_ok=True)
        for name in files:
            shutil.copyfile(os.path.join(template, name), os.path.join(session, name))
        made += 1
    return made


class Daemon:
    def __init__(self, binary, folder, cache, workers, log_path):
        self.port_file = tempfile.mktemp(prefix="catalog-bench-port-")
        self.log = open(log_path, "w")
        environment = dict(os.environ)
        self.runtime_dir = tempfile.mkdtemp(prefix="catalog-bench-run-")
        environment["QUANTEM_GPU_RUNTIME_DIR"] = self.runtime_dir
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [binary, "serve", folder, "--backend", "cpu", "--port", "0", "--port-file", self.port_file,
             "--catalog-cache", cache, "--inspect-workers", str(workers)],
            stdout=self.log, stderr=self.log, env=environment)
        while not os.path.exists(self.port_file) or not open(self.port_file).read().strip():
            if self.process.poll() is not None:
                raise SystemExit("the daemon exited: see " + log_path)
            time.sleep(0.005)
        self.port = int(open(self.port_file).read())
        self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)

    def get(self, target, headers=None):
        self.connection.request("GET", target, headers=headers or {})
        response = self.connection.getresponse()
        return response.status, dict((k.lower(), v) for k, v in response.getheaders()), response.read()

    def wait_ready(self):
        while True:
            try:
                status, _, _ = self.get("/api/health/ready")
                if status == 200:
                    return time.monotonic() - self.started
            except (ConnectionError, http.client.HTTPException):
                self.connection.close()
            time.sleep(0.005)

    def wait_watching(self):
        """Seconds from the start until /api/health/ready reports the watcher set up."""
        while True:
            _, _, body = self.get("/api/health/ready")
            if json.loads(body).get("watcher", {}).get("kind") != "starting":
                return time.monotonic() - self.started
            time.sleep(0.01)

    def cpu_seconds(self):
        """The daemon's user + system CPU time so far (its workers not included)."""
        fields = open("/proc/%d/stat" % self.process.pid).read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_bytes(self):
        for line in open("/proc/%d/status" % self.process.pid):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return None

    def stop(self):
        self.connection.close()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=120)
        self.log.close()
        os.unlink(self.port_file)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


def build_counts(log_path):
    found = re.findall(r"(\d+) masters \((\d+) reused, (\d+) inspected\) in ([0-9.]+) s", open(log_path).read())
    return [{"masters": int(m), "reused": int(r), "inspected": int(i), "build_s": float(s)} for m, r, i, s in found]


def timed(function):
    start = time.monotonic()
    result = function()
    return time.monotonic() - start, result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--folder", help="data folder (kept between runs; default: a temporary one)")
    parser.add_argument("--inspect-workers", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the generated folder")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    folder = args.folder or tempfile.mkdtemp(prefix="catalog-bench-")
    os.makedirs(folder, exist_ok=True)
    work = tempfile.mkdtemp(prefix="catalog-bench-work-")
    cache = os.path.join(work, "catalog.bin")
    report = {"count": args.count, "cores": os.cpu_count(), "inspect_workers": args.inspect_workers,
              "load_average_1min_at_start": os.getloadavg()[0]}
    report["generate_s"], report["generated"] = timed(lambda: generate(binary, folder, args.count))

    first_log = os.path.join(work, "first.log")
    daemon = Daemon(binary, folder, cache, args.inspect_workers, first_log)
    report["first_build_to_ready_s"] = daemon.wait_ready()
    report["first_build_daemon_cpu_s"] = daemon.cpu_seconds()
    seconds, (status, headers, body) = timed(lambda: daemon.get("/api/browse/sessions"))
    report["sessions_first_get_s"] = seconds
    report["sessions_bytes"] = len(body)
    etag = headers.get("etag")
    _, (_, zipped_headers, zipped) = timed(lambda: daemon.get("/api/browse/sessions", {"Accept-Encoding": "gzip"}))
    report["sessions_gzip_bytes"] = len(zipped) if zipped_headers.get("content-encoding") == "gzip" else None
    polls = []
    for _ in range(50):
        seconds, (status, _, _) = timed(lambda: daemon.get("/api/browse/sessions", {"If-None-Match": etag}))
        assert status == 304, status
        polls.append(seconds)
    polls.sort()
    report["poll_304_median_s"] = polls[len(polls) // 2]
    # Within the refresh interval (1 s) of the last build, with the watcher's word
    # that nothing changed, a refresh reuses that build; after it, it builds again.
    report["refresh_unchanged_reused_s"], _ = timed(lambda: daemon.get("/api/browse/sessions?refresh=true"))
    time.sleep(1.2)
    cpu_before = daemon.cpu_seconds()
    report["refresh_unchanged_s"], _ = timed(lambda: daemon.get("/api/browse/sessions?refresh=true"))
    report["refresh_unchanged_daemon_cpu_s"] = daemon.cpu_seconds() - cpu_before
    polls = []
    for _ in range(5):
        seconds, _ = timed(lambda: daemon.get("/api/browse/acquisitions"))
        polls.append(seconds)
    report["acquisitions_poll_unchanged_median_s"] = sorted(polls)[len(polls) // 2]
    seconds, (_, _, acquisitions) = timed(lambda: daemon.get("/api/browse/acquisitions"))
    report["acquisitions_get_s"] = seconds
    report["acquisitions_bytes"] = len(acquisitions)

    daemon.wait_watching()  # the new acquisition below is found by the watcher

    # One new acquisition: the shard first, then the master renamed into place.
    template = os.path.join(folder, "_template")
    session = os.path.join(folder, "new-%d" % os.getpid())
    os.makedirs(session)
    for name in sorted(os.listdir(template)):
        if not name.endswith("_master.h5"):
            shutil.copyfile(os.path.join(template, name), os.path.join(session, name))
    shutil.copyfile(os.path.join(template, "acq_master.h5"), os.path.join(session, ".acq_master.h5.part"))
    written = time.monotonic()
    os.rename(os.path.join(session, ".acq_master.h5.part"), os.path.join(session, "acq_master.h5"))
    master = os.path.join(session, "acq_master.h5")
    while True:
        _, _, body = daemon.get("/api/browse/acquisitions")
        document = json.loads(body)
        if any(entry.get("path") == master for entry in document.get("history", [])):  # history: ready
            break
        time.sleep(0.01)
    report["new_acquisition_listed_by_acquisitions_s"] = time.monotonic() - written
    seconds, (_, _, body) = timed(lambda: daemon.get("/api/browse/sessions?refresh=true"))
    assert os.path.basename(session) in body.decode(), "the refresh does not list the new acquisition"
    report["new_acquisition_refresh_s"] = seconds
    report["new_acquisition_listed_by_sessions_s"] = time.monotonic() - written
    report["rss_bytes"] = daemon.rss_bytes()
    time.sleep(0.5)  # the cache write after the last build
    daemon.stop()
    report["first_run_builds"] = build_counts(first_log)
    shutil.rmtree(session)

    restart_log = os.path.join(work, "restart.log")
    daemon = Daemon(binary, folder, cache, args.inspect_workers, restart_log)
    report["restart_unchanged_to_ready_s"] = daemon.wait_ready()
    report["restart_to_watching_s"] = daemon.wait_watching()
    report["restart_daemon_cpu_s"] = daemon.cpu_seconds()
    report["load_average_1min"] = os.getloadavg()[0]
    report["restart_rss_bytes"] = daemon.rss_bytes()
    daemon.stop()
    report["restart_builds"] = build_counts(restart_log)
    report["cache_file_bytes"] = os.path.getsize(cache)

    shutil.rmtree(work)
    if not args.folder and not args.keep:
        shutil.rmtree(folder)
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
