#!/usr/bin/env python3
"""The viewer with large catalogs in headless Chromium: prints JSON.

For N in --counts (default 3, 3000, 20000): N small acquisitions (one `synth`
acquisition's master linked under 100 names per session folder) plus a 40x48
`synth` acquisition listed last, served by `serve --backend cpu`; then
  click_to_bf_ms       click on the last acquisition (not resident) -> its BF drawn
                       (the load included), measured in the page
  list_update          a new acquisition appears: the poll that sees it, the
                       rebuild, the list drawn again; the longest task meanwhile
                       (PerformanceObserver 'longtask', which reports tasks of
                       50 ms or more: 0 means none; each with its start), the
                       longest gap between animation frames, and the page's own
                       work for the new rows (accepting them, drawing those in view)
  scroll               the list scrolled top to bottom in 40 steps: the same two
  poll_unchanged       /api/browse/acquisitions and /api/browse/sessions polled
                       with nothing changed: status and body bytes

  tests/browser/viewer_browser_bench.py --binary build/src/cli/quantem-gpu [--counts 3,3000,20000]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import viewer_browser_test as base  # noqa: E402

PER_SESSION = 100

MONITOR = """
window.benchMonitor = {longest: 0, gap: 0, last: performance.now(), on: true, tasks: [], since: performance.now()};
new PerformanceObserver((list) => {
  const m = window.benchMonitor;
  for (const entry of list.getEntries()) {
    m.longest = Math.max(m.longest, entry.duration);
    m.tasks.push([Math.round(entry.startTime - m.since), Math.round(entry.duration)]);
  }
}).observe({type: 'longtask', buffered: false});
(function frame(now) {
  const m = window.benchMonitor;
  m.gap = Math.max(m.gap, now - m.last);
  m.last = now;
  if (m.on) requestAnimationFrame(frame);
})(performance.now());
"""


def link_or_copy(source, target):
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def make_catalog(binary, work, count):
    data = os.path.join(work, "data")
    template = os.path.join(work, "template")
    subprocess.run([binary, "synth", template, "--prefix", "acq", "--scan", "4x4", "--detector", "8x8",
                    "--threads", "1"], check=True, stdout=subprocess.DEVNULL)
    for i in range(count):
        folder = os.path.join(data, "beamtime", f"s{i // PER_SESSION:04d}")
        if i % PER_SESSION == 0:
            os.makedirs(folder)
            link_or_copy(os.path.join(template, "acq_data_000001.h5"), os.path.join(folder, "acq_data_000001.h5"))
        link_or_copy(os.path.join(template, "acq_master.h5"), os.path.join(folder, f"acq{i % PER_SESSION:03d}_master.h5"))
    subprocess.run([binary, "synth", os.path.join(data, "zz", "last"), "--prefix", "demo", "--scan", "40x48",
                    "--detector", "64x64", "--threads", "1"], check=True, stdout=subprocess.DEVNULL)
    return data, template


def monitor(driver, reset=True):
    if reset:
        driver.execute_script("window.benchMonitor.longest = 0; window.benchMonitor.gap = 0; window.benchMonitor.tasks = [];"
                              " window.benchMonitor.last = window.benchMonitor.since = performance.now();")
    return driver.execute_script("return [window.benchMonitor.longest, window.benchMonitor.gap];")


def long_tasks(driver):
    """[start ms after the monitor's reset, duration ms] of each task of 50 ms or more."""
    return driver.execute_script("return window.benchMonitor.tasks;")


def wait(driver, script, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = driver.execute_script(f"return ({script});")
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out: {script}")


def measure(binary, count):
    work = tempfile.mkdtemp(prefix="quantem-viewer-bench-")
    try:
        data, template = make_catalog(binary, work, count)
        started = time.time()
        daemon = base.Daemon(data, work)
        ready_s = time.time() - started
        driver = base.start_browser(os.path.join(work, "profile"))
        driver.set_script_timeout(300)
        try:
            return run_rows(driver, daemon, data, template, count, ready_s)
        finally:
            driver.quit()
            daemon.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_rows(driver, daemon, data, template, count, ready_s):
    driver.get(daemon.url)
    wait(driver, f"document.getElementById('catalog-count').textContent === '{count + 1}'")
    driver.execute_script(MONITOR)
    time.sleep(0.5)
    row = {"acquisitions": count + 1, "daemon_ready_s": round(ready_s, 2)}

    # scroll top to bottom
    monitor(driver)
    driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const list = document.getElementById('acquisition-list');
        let step = 0;
        (function next() {
          list.scrollTop = (list.scrollHeight - list.clientHeight) * step / 40;
          if (++step > 40) { setTimeout(done, 300); return; }
          requestAnimationFrame(() => requestAnimationFrame(next));
        })();""")
    longest, gap = monitor(driver, reset=False)
    row["scroll"] = {"longest_task_ms": round(longest, 1), "longest_frame_gap_ms": round(gap, 1),
                     "long_tasks": long_tasks(driver),
                     "rows_in_dom": driver.execute_script(
                         "return document.querySelectorAll('#acquisition-list .acquisition').length;")}

    # click -> BF drawn (the load included)
    wait(driver, "document.querySelector(`.acquisition[data-file='demo_master.h5']`)")
    click_ms = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const canvas = document.getElementById('realspace-canvas');
        const before = canvas.dataset.frame;
        const t0 = performance.now();
        document.querySelector(`.acquisition[data-file='demo_master.h5']`).click();
        (function check() {
          const r = window.quantemViewer.state.realspace;
          if (r && r.params.file === 'demo_master.h5' && canvas.dataset.frame !== before) done(performance.now() - t0);
          else requestAnimationFrame(check);
        })();""")
    row["click_to_bf_ms"] = round(click_ms, 1)

    # the list updates: a new acquisition, seen by the poll (once the opened
    # acquisition's strip, pattern and residency are all drawn)
    wait(driver, "document.getElementById('product-strip').dataset.frame"
                 " && document.getElementById('diffraction-canvas').dataset.frame"
                 " && document.getElementById('residency-state').textContent.startsWith('resident')")
    time.sleep(2.0)
    monitor(driver)
    folder = os.path.join(data, "beamtime", "new")
    os.makedirs(folder)
    link_or_copy(os.path.join(template, "acq_data_000001.h5"), os.path.join(folder, "acq_data_000001.h5"))
    link_or_copy(os.path.join(template, "acq_master.h5"), os.path.join(folder, "acq_master.h5"))
    t0 = time.time()
    # The page's own 5 s poll finds it; the bench only looks once a second.
    while driver.execute_script("return document.getElementById('catalog-count').textContent;") != str(count + 2):
        if time.time() - t0 > 300:
            raise RuntimeError("the new acquisition never appeared")
        time.sleep(1.0)
    time.sleep(0.3)
    longest, gap = monitor(driver, reset=False)
    work = driver.execute_script("return [window.quantemViewer.state.catalog.acceptMs,"
                                 " window.quantemViewer.catalogView.drawMs];")
    row["list_update"] = {"longest_task_ms": round(longest, 1), "longest_frame_gap_ms": round(gap, 1),
                          "long_tasks": long_tasks(driver), "seconds_to_listed": round(time.time() - t0, 2),
                          "page_work_ms": {"accept_rows": round(work[0], 2), "draw_rows": round(work[1], 2)},
                          "load_average": os.getloadavg()[0]}

    # unchanged polls
    driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                " window.quantemViewer.pollAcquisitions().then(() => window.quantemViewer.pollAcquisitions())"
                                ".then(() => window.quantemViewer.loadSessions(false)).then(done);")
    records = driver.execute_script(
        "return window.quantemViewer.state.requests.map(r => [r.path, r.status, r.bytes]);")
    last = {}
    for path, status, size in records:
        last[path] = {"status": status, "bytes": size}
    row["poll_unchanged"] = {"acquisitions": last.get("/api/browse/acquisitions"),
                             "sessions": last.get("/api/browse/sessions")}
    _, headers, body = daemon.get("/api/browse/acquisitions")
    row["poll_unchanged"]["acquisitions_plain_bytes"] = len(body)
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--counts", default="3,3000,20000")
    args = parser.parse_args()
    base.ARGS = argparse.Namespace(binary=args.binary, artifacts=tempfile.gettempdir())
    missing = base.missing_tools()
    if missing:
        print(json.dumps({"error": f"missing {', '.join(missing)}"}))
        return 1
    rows = [measure(args.binary, int(count)) for count in args.counts.split(",")]
    print(json.dumps({"benchmark": "viewer_browser", "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
