#!/usr/bin/env python3
"""Times saving plans as Arina-style acquisitions, as a user would, and the
disk floor under each: prints one JSON document.

  export_bench.py BIN DATA_DIR EXPORT_DIR ROWS_JSON [--device-arg ARG]... [--env NAME=VALUE]...

ROWS_JSON: a list of rows, each {"name", "session", "file", "plan": {query
parameters}, "via": "http" | "cli", "master": path (cli rows)}. "http" rows
run against `BIN serve DATA_DIR --export-dir EXPORT_DIR` started here with
the device arguments (one daemon for every http row): the source is made
resident first (a BF image), then the time is POST /api/browse/export ->
the job's document says done, polled every 5 ms. "cli" rows time `BIN export
MASTER EXPORT_DIR ...` from process start to exit (its load included). Each
row's export is deleted after it is measured, then the floor is measured:
the same number of bytes written sequentially (8 MiB writes, no fsync, as
the export's files are closed, not synced) into a fresh file of EXPORT_DIR.
"""
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request


def request(method, url):
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=600) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def write_floor(folder, total_bytes):
    """Seconds to write total_bytes sequentially into a new file of folder."""
    path = os.path.join(folder, ".write-floor")
    block = b"\x5a" * (8 << 20)
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as out:
        left = total_bytes
        while left > 0:
            n = min(left, len(block))
            out.write(block[:n])
            left -= n
    seconds = time.perf_counter() - start
    os.unlink(path)
    return seconds


def start_daemon(binary, data_dir, export_dir, device_args, env):
    port_file = os.path.join(export_dir, ".bench-port")
    if os.path.exists(port_file):
        os.unlink(port_file)
    log = open(os.path.join(export_dir, ".bench-daemon.log"), "w")
    daemon = subprocess.Popen([binary, "serve", data_dir, "--export-dir", export_dir, "--port", "0",
                               "--port-file", port_file] + device_args, stdout=log, stderr=log, env=env)
    for _ in range(1200):
        if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
            break
        if daemon.poll() is not None:
            raise RuntimeError("the daemon exited at start")
        time.sleep(0.05)
    with open(port_file) as f:
        return daemon, "http://127.0.0.1:" + f.read().strip()


def query(parameters):
    return "&".join(f"{k}={v}" for k, v in parameters.items())


def http_row(url, row):
    source = {"session": row["session"], "file": row["file"]}
    status, body = request("GET", f"{url}/api/browse/realspace?{query(source)}&mode=BF&ensure_resident=true")
    if status != 200:
        raise RuntimeError(f"making {row['file']} resident: {status} {body[:200]!r}")
    start = time.perf_counter()
    status, body = request("POST", f"{url}/api/browse/export?{query({**source, **row.get('plan', {})})}")
    if status != 202:
        raise RuntimeError(f"POST export: {status} {body[:300]!r}")
    job = json.loads(body)
    while True:
        status, body = request("GET", f"{url}/api/browse/export/{job['id']}")
        job = json.loads(body)
        if job["state"] in ("done", "failed", "cancelled"):
            break
        time.sleep(0.005)
    seconds = time.perf_counter() - start
    if job["state"] != "done":
        raise RuntimeError(f"export {job['state']}: {json.dumps(job.get('error'))}")
    result = job["result"]
    return seconds, result, os.path.join(job["export_dir"], job["folder"])


def cli_row(binary, export_dir, row, env):
    arguments = [binary, "export", row["master"], export_dir] + row.get("arguments", [])
    start = time.perf_counter()
    done = subprocess.run(arguments, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"export exited {done.returncode}: {done.stderr[-500:]}")
    report = json.loads(done.stdout)
    return seconds, report, report.get("folder") or report.get("path")


def main():
    binary, data_dir, export_dir, rows_path = sys.argv[1:5]
    device_args, extra_env = [], {}
    rest = sys.argv[5:]
    while rest:
        if rest[0] == "--device-arg":
            device_args.append(rest[1])
        elif rest[0] == "--env":
            name, value = rest[1].split("=", 1)
            extra_env[name] = value
        rest = rest[2:]
    env = dict(os.environ, **extra_env)
    with open(rows_path) as f:
        rows = json.load(f)
    os.makedirs(export_dir, exist_ok=True)
    out = {"benchmark": "export", "device_args": device_args, "env": extra_env, "rows": []}
    daemon, url = None, None
    try:
        for row in rows:
            entry = {"name": row["name"], "via": row["via"], "plan": row.get("plan", row.get("arguments"))}
            try:
                if row["via"] == "http":
                    if daemon is None:
                        daemon, url = start_daemon(binary, data_dir, export_dir, device_args, env)
                    seconds, result, folder = http_row(url, row)
                else:
                    seconds, result, folder = cli_row(binary, export_dir, row, env)
                entry.update({"seconds": round(seconds, 4), "result": result})
                if folder and os.path.isdir(folder):
                    shutil.rmtree(folder)
                written = result.get("output_bytes") or result.get("stored_bytes") or 0
                floor = write_floor(export_dir, written)
                entry["write_floor_seconds"] = round(floor, 4)
                entry["over_floor"] = round(seconds / floor, 3) if floor > 0 else None
            except Exception as error:  # one row's failure is reported, the others still run
                entry["error"] = str(error)
            out["rows"].append(entry)
            print(json.dumps(entry), file=sys.stderr)
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=60)
    print(json.dumps(out, indent=1))
    return 0 if all("error" not in r for r in out["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
