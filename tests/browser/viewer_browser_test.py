#!/usr/bin/env python3
"""The viewer in a real browser: headless Chromium (Debian's `chromium`)
driven through WebDriver (`chromium-driver`, `python3-selenium`) against the
real `quantem-gpu serve --backend cpu` on a `synth` acquisition.

  viewer_browser_test.py --binary build/src/cli/quantem-gpu --artifacts DIR

Screenshots of every step go to DIR. Exit 77 (ctest: skipped) when Chromium,
its driver or Selenium is missing, unless QUANTEM_BROWSER_TEST_REQUIRED=1
(scripts/test.sh sets it: CI installs them), which makes that a failure.
"""
import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

SKIP = 77
CHROMIUM_CANDIDATES = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
DRIVER_CANDIDATES = ["/usr/bin/chromedriver"]
TOKEN = "viewer-test-token-5f0c1d2e3a4b"
SESSION = "demo/20261202_session"
MASTER = "demo_master.h5"
SCAN = (40, 48)
DETECTOR = (64, 64)

ARGS = None


def find(candidates):
    for path in candidates:
        if os.path.exists(path):
            return path
    return None


def missing_tools():
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("python3-selenium")
    if not find(CHROMIUM_CANDIDATES):
        missing.append("chromium")
    if not find(DRIVER_CANDIDATES):
        missing.append("chromium-driver")
    return missing


class Daemon:
    """The real binary on an ephemeral port; stderr kept for inspection."""

    def __init__(self, data_dir, work_dir, extra_args=(), env=None, wait_ready=True, port=0):
        self.port_file = os.path.join(work_dir, f"port-{len(os.listdir(work_dir))}")
        self.log_path = self.port_file + ".log"
        self.log = open(self.log_path, "wb")
        runtime = os.path.join(work_dir, "runtime")
        os.makedirs(runtime, mode=0o700, exist_ok=True)
        # The catalog cache goes to this run's folder, not the user's.
        environment = dict(os.environ, QUANTEM_GPU_RUNTIME_DIR=runtime, XDG_CACHE_HOME=os.path.join(work_dir, "cache"),
                           **(env or {}))
        self.process = subprocess.Popen(
            [ARGS.binary, "serve", data_dir, "--backend", "cpu", "--port", str(port), "--port-file", self.port_file,
             "--device-budget", "1GiB", *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT, env=environment)
        deadline = time.time() + 60
        while not os.path.exists(self.port_file):
            if self.process.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the daemon did not start: {self.output()}")
            time.sleep(0.05)
        with open(self.port_file) as port_file:
            self.port = int(port_file.read().strip())
        self.url = f"http://127.0.0.1:{self.port}/"
        while wait_ready:  # ready: catalog built
            try:
                with urllib.request.urlopen(self.url + "api/health/ready", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("the daemon never became ready")
            time.sleep(0.1)

    def get(self, path, headers=None):
        request = urllib.request.Request(self.url + path.lstrip("/"), headers=headers or {})
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()

    def output(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, "rb") as log:
            return log.read().decode("utf-8", "replace")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def start_browser(profile_dir):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = find(CHROMIUM_CANDIDATES)
    # As root, Chromium needs --no-sandbox; the rest keeps it off the network.
    for argument in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--disable-dev-shm-usage", "--window-size=1440,960", "--force-device-scale-factor=1",
                     f"--user-data-dir={profile_dir}"]:
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(find(DRIVER_CANDIDATES)), options=options)


class BrowserCase(unittest.TestCase):
    auth_args = ()
    auth_env = None
    export_dir = False  # serve --export-dir DATA/exports
    synth_args = ()  # more `synth` options for the demo acquisition (a calibration)

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="quantem-viewer-test-")
        cls.data = os.path.join(cls.work, "data")
        session_dir = os.path.join(cls.data, SESSION)
        os.makedirs(session_dir)
        subprocess.run([ARGS.binary, "synth", session_dir, "--prefix", "demo", "--scan", f"{SCAN[0]}x{SCAN[1]}",
                        "--detector", f"{DETECTOR[0]}x{DETECTOR[1]}", "--preset", "realistic", *cls.synth_args],
                       check=True, stdout=subprocess.DEVNULL)
        extra_args = tuple(cls.auth_args)
        if cls.export_dir:
            cls.exports = os.path.join(cls.data, "exports")
            os.makedirs(cls.exports)
            extra_args += ("--export-dir", cls.exports)
        cls.daemon = Daemon(cls.data, cls.work, extra_args, cls.auth_env)
        cls.driver = start_browser(os.path.join(cls.work, "profile"))
        cls.driver.set_script_timeout(30)

    @classmethod
    def tearDownClass(cls):
        try:
            cls.driver.quit()
        finally:
            cls.daemon.stop()
            shutil.rmtree(cls.work, ignore_errors=True)

    # ---- helpers ----

    def screenshot(self, name):
        os.makedirs(ARGS.artifacts, exist_ok=True)
        self.driver.save_screenshot(os.path.join(ARGS.artifacts, f"{name}.png"))

    def wait_for(self, script, what, timeout=60):
        """Polls a JavaScript expression until it is truthy; returns its value."""
        deadline = time.time() + timeout
        value = None
        while time.time() < deadline:
            value = self.driver.execute_script(f"return ({script});")
            if value:
                return value
            time.sleep(0.1)
        self.screenshot(f"timeout-{self.id().split('.')[-1]}")
        self.fail(f"timed out waiting for {what}; last value {value!r}; "
                  f"browser log: {self.browser_log()}; daemon: {self.daemon.output()[-2000:]}")

    def browser_log(self):
        try:
            return [entry["message"] for entry in self.driver.get_log("browser")][-10:]
        except Exception:  # noqa: BLE001 - diagnostics only
            return []

    def mouse(self, kind, x, y, buttons=0):
        """A real input event through the DevTools protocol (viewport coordinates)."""
        event = {"type": kind, "x": x, "y": y, "button": "left" if kind != "mouseMoved" or buttons else "none",
                 "buttons": buttons, "clickCount": 1 if kind != "mouseMoved" else 0}
        self.driver.execute_cdp_cmd("Input.dispatchMouseEvent", event)

    def canvas_variance(self, element_id):
        return self.driver.execute_script("""
            const canvas = document.getElementById(arguments[0]);
            if (canvas.width < 2 || canvas.height < 2) return 0;
            const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
            let sum = 0, sumSquares = 0, n = 0;
            for (let i = 0; i < data.length; i += 4) {
              const v = data[i] + data[i + 1] + data[i + 2];
              sum += v; sumSquares += v * v; n++;
            }
            const mean = sum / n;
            return sumSquares / n - mean * mean;""", element_id)

    def open_page(self, fragment=""):
        self.driver.get("about:blank")  # a fragment-only change would not reload the page
        self.driver.get(self.daemon.url + fragment)

    def open_acquisition(self):
        self.wait_for("document.querySelector('.acquisition')", "the acquisition list")
        self.driver.execute_script(
            "document.querySelector(`.acquisition[data-file='${arguments[0]}']`).click();", MASTER)
        self.wait_for("document.getElementById('realspace-canvas').dataset.frame", "the real-space image")
        self.wait_for("document.getElementById('diffraction-canvas').dataset.frame", "the mean pattern")


class ViewerWithoutToken(BrowserCase):
    def test_1_page_and_assets_are_served_with_validators(self):
        status, headers, body = self.daemon.get("/")
        self.assertEqual(status, 200)
        headers = {k.lower(): v for k, v in headers.items()}
        self.assertEqual(headers["content-type"], "text/html; charset=utf-8")
        self.assertEqual(headers["cache-control"], "no-cache")
        self.assertIn("default-src 'none'", headers["content-security-policy"])
        self.assertIn(b'<script type="module" src="/viewer/main.js">', body)
        status, script_headers, _ = self.daemon.get("/viewer/main.js")
        script_headers = {k.lower(): v for k, v in script_headers.items()}
        self.assertEqual(script_headers["content-type"], "text/javascript; charset=utf-8")
        with self.assertRaises(urllib.error.HTTPError) as not_modified:
            self.daemon.get("/viewer/main.js", {"If-None-Match": script_headers["etag"]})
        self.assertEqual(not_modified.exception.code, 304)
        with self.assertRaises(urllib.error.HTTPError) as foreign:
            self.daemon.get("/", {"Host": "attacker.example:8780"})
        self.assertEqual(foreign.exception.code, 403)

    def test_2_list_image_click_and_mask_drag(self):
        self.open_page()
        self.wait_for("document.querySelector('.acquisition')", "the acquisition list")
        item_text = self.driver.execute_script("return document.querySelector('.acquisition').textContent")
        self.assertIn("demo", item_text)
        self.assertIn(f"{SCAN[0]}×{SCAN[1]}", item_text)
        self.assertIn("ready", item_text)
        self.screenshot("01-acquisition-list")

        self.open_acquisition()
        realspace = self.driver.execute_script(
            "const r = window.quantemViewer.state.realspace; return [r.image.width, r.image.height, r.params.mode];")
        self.assertEqual(realspace, [SCAN[1], SCAN[0], "BF"])
        self.assertGreater(self.canvas_variance("realspace-canvas"), 0, "the BF canvas is blank")
        self.assertGreater(self.canvas_variance("diffraction-canvas"), 0, "the mean pattern is blank")
        # The page shows the daemon's exact BF values: compare with a direct request.
        _, _, raw = self.daemon.get(f"/api/browse/realspace?session={SESSION}&file={MASTER}&mode=BF&inner=0&outer=1")
        direct = struct.unpack(f"<{len(raw) // 4}I", raw)
        shown = self.driver.execute_script("return Array.from(window.quantemViewer.state.realspace.image.data);")
        self.assertEqual(list(direct), shown)
        # Contrast limits are numpy.percentile's (linear interpolation), for integer
        # images and for float images with NaNs.
        import numpy
        percents = [0, 0.5, 12.3, 50, 99.5, 100]
        shown_limits = self.driver.execute_script(
            "return window.quantemViewer.percentiles(window.quantemViewer.state.realspace.image.data, arguments[0]);",
            percents)
        for got, expected in zip(shown_limits, numpy.percentile(numpy.array(direct, dtype=numpy.float64), percents)):
            self.assertAlmostEqual(got, expected, delta=1e-9 * max(1.0, abs(expected)))
        floats = numpy.sin(numpy.arange(1001) * 0.37).astype(numpy.float32) * 1e3
        nan_at = [3, 500, 1000]
        shown_limits = self.driver.execute_script("""
            const values = Float32Array.from(arguments[0]);
            for (const i of arguments[1]) values[i] = NaN;
            return window.quantemViewer.percentiles(values, arguments[2]);""", floats.tolist(), nan_at, percents)
        finite = numpy.delete(floats, nan_at).astype(numpy.float64)
        for got, expected in zip(shown_limits, numpy.percentile(finite, percents)):
            self.assertAlmostEqual(got, expected, delta=1e-6 * max(1.0, abs(expected)))
        # Residency: the acquisition is resident after the viewer opened it.
        self.wait_for("document.getElementById('residency-state').textContent.startsWith('resident')",
                      "the residency badge to say resident")
        self.screenshot("02-bright-field")

        # Saving: the PNG at the image's resolution, the .npy exactly the daemon's values.
        downloads = os.path.join(self.work, "downloads")
        os.makedirs(downloads, exist_ok=True)
        self.driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": downloads})
        self.driver.execute_script("document.getElementById('save-npy').click();"
                                   "document.getElementById('save-png').click();")
        npy_path = os.path.join(downloads, "demo_BF_s1d1.npy")
        png_path = os.path.join(downloads, "demo_BF_s1d1.png")
        deadline = time.time() + 30
        while not (os.path.exists(npy_path) and os.path.exists(png_path)) and time.time() < deadline:
            time.sleep(0.1)
        self.assertTrue(os.path.exists(npy_path), os.listdir(downloads))
        self.assertTrue(os.path.exists(png_path), os.listdir(downloads))
        with open(npy_path, "rb") as npy:
            saved = npy.read()
        _, _, direct_npy = self.daemon.get(
            f"/api/browse/realspace?session={SESSION}&file={MASTER}&mode=BF&inner=0&outer=1&format=npy")
        self.assertEqual(saved, direct_npy)
        with open(png_path, "rb") as png:
            header = png.read(24)
        self.assertEqual(header[:8], b"\x89PNG\r\n\x1a\n")
        self.assertEqual(struct.unpack(">II", header[16:24]), (SCAN[1], SCAN[0]))

        # A click on the real-space image fetches and draws that position's pattern.
        self.driver.execute_script("document.getElementById('follow-pointer').checked = false;")
        rect = self.driver.execute_script(
            "const r = document.getElementById('realspace-overlay').getBoundingClientRect();"
            "return [r.left, r.top, r.width, r.height];")
        row, col = 7, 30
        x = rect[0] + (col + 0.5) * rect[2] / SCAN[1]
        y = rect[1] + (row + 0.5) * rect[3] / SCAN[0]
        cbed_before = self.driver.execute_script(
            "return window.quantemViewer.state.requests.filter(r => r.path === '/api/browse/cbed').length;")
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y, buttons=1)
        self.mouse("mouseReleased", x, y)
        expected_source = json.dumps({"kind": "position", "row": row, "col": col}, separators=(",", ":"))
        self.wait_for(f"document.getElementById('diffraction-canvas').dataset.source === {json.dumps(expected_source)}",
                      "the clicked position's pattern")
        cbed_after = self.driver.execute_script(
            "return window.quantemViewer.state.requests.filter(r => r.path === '/api/browse/cbed').length;")
        self.assertGreater(cbed_after, cbed_before)
        self.assertGreater(self.canvas_variance("diffraction-canvas"), 0)
        _, _, raw = self.daemon.get(f"/api/browse/cbed?session={SESSION}&file={MASTER}&sx={row}&sy={col}")
        self.assertEqual(list(struct.unpack(f"<{len(raw) // 4}I", raw)),
                         self.driver.execute_script("return Array.from(window.quantemViewer.state.diffraction.image.data);"))
        self.screenshot("03-clicked-position")

        # Dragging the mask's outer ring changes the next request's radius.
        mask = self.driver.execute_script("""
            const s = window.quantemViewer.state;
            const r = document.getElementById('diffraction-overlay').getBoundingClientRect();
            return {row: s.mask.row, col: s.mask.col, outer: s.mask.outer, radius: s.fit.radius,
                    width: s.diffraction.image.width, height: s.diffraction.image.height,
                    left: r.left, top: r.top, cssWidth: r.width, cssHeight: r.height};""")
        self.assertGreater(mask["outer"], 1)
        unit = mask["cssWidth"] / mask["width"]
        start_x = mask["left"] + (mask["col"] + 0.5 + mask["outer"]) * unit
        start_y = mask["top"] + (mask["row"] + 0.5) * mask["cssHeight"] / mask["height"]
        grow = 6.0
        self.mouse("mouseMoved", start_x, start_y)
        self.mouse("mousePressed", start_x, start_y, buttons=1)
        for step in range(1, 7):
            self.mouse("mouseMoved", start_x + grow * unit * step / 6, start_y, buttons=1)
        self.mouse("mouseReleased", start_x + grow * unit, start_y)
        expected_outer_px = mask["outer"] + grow
        last = self.wait_for(f"""(() => {{
            const v = window.quantemViewer;
            const r = v.state.realspace;
            const used = r.image.provenance.geometry.outer_radius_px;
            return !v.realspaceChannel.inFlight && Math.abs(used - {expected_outer_px}) < 0.05
                ? {{outer: Number(r.params.outer), used}} : null;
        }})()""", "a real-space image computed with the dragged radius")
        self.assertAlmostEqual(last["outer"], expected_outer_px / mask["radius"], places=3)
        last_request = self.driver.execute_script(
            "return window.quantemViewer.state.requests.filter(r => r.path === '/api/browse/realspace').pop().query;")
        self.assertIn("outer=", last_request)
        self.assertNotIn("outer=1&", last_request + "&")
        self.screenshot("04-mask-dragged")

        # Each request's server-timing is shown, or "—" when the daemon sends none.
        row = self.driver.execute_script("""
            const record = window.quantemViewer.state.requests.filter(r => r.path === '/api/browse/realspace').pop();
            const row = Array.from(document.querySelectorAll('#request-log tr')).find(r => r.dataset.url === record.query);
            return {header: record.serverTiming, cell: row ? row.lastChild.textContent : null};""")
        self.assertIsNotNone(row["cell"], "the realspace request is missing from the request table")
        if row["header"] is None:
            self.assertEqual(row["cell"], "\u2014")
        else:
            self.assertIn(" ms", row["cell"])
        formatted = self.driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            import('/viewer/api.js').then(api => done([
              api.formatServerTiming('decode;dur=0.0123, total;dur=12.5, cache;desc=hit'),
              api.formatServerTiming(null)]));""")
        self.assertEqual(formatted, ["decode 0.01 ms, total 12.5 ms, cache hit", "\u2014"])

        # Hovering across many positions: the pattern shown at the end is the
        # last position's (no queue of stale answers drawn after it).
        self.driver.execute_script("document.getElementById('follow-pointer').checked = true;")
        for step in range(25):
            self.mouse("mouseMoved", rect[0] + (step + 0.5) * rect[2] / SCAN[1], rect[1] + 12.5 * rect[3] / SCAN[0])
        final = json.dumps({"kind": "position", "row": 12, "col": 24}, separators=(",", ":"))
        self.wait_for(f"document.getElementById('diffraction-canvas').dataset.source === {json.dumps(final)} && "
                      "!window.quantemViewer.diffractionChannel.inFlight", "the last hovered position's pattern")
        issued = self.driver.execute_script("return window.quantemViewer.diffractionChannel.issued;")
        self.assertGreater(issued, 0)

        # A rectangle region gives its mean pattern.
        self.driver.execute_script("""
            document.getElementById('follow-pointer').checked = false;
            document.getElementById('tool-select').value = 'rectangle';""")
        x0, y0 = rect[0] + 4.5 * rect[2] / SCAN[1], rect[1] + 5.5 * rect[3] / SCAN[0]
        x1, y1 = rect[0] + 13.5 * rect[2] / SCAN[1], rect[1] + 10.5 * rect[3] / SCAN[0]
        self.mouse("mouseMoved", x0, y0)
        self.mouse("mousePressed", x0, y0, buttons=1)
        self.mouse("mouseMoved", (x0 + x1) / 2, (y0 + y1) / 2, buttons=1)
        self.mouse("mouseMoved", x1, y1, buttons=1)
        self.mouse("mouseReleased", x1, y1)
        self.wait_for("JSON.parse(document.getElementById('diffraction-canvas').dataset.source || '{}').kind === 'rectangle'",
                      "the rectangle's mean pattern")
        divisor = self.driver.execute_script("return window.quantemViewer.state.diffraction.image.divisor;")
        self.assertEqual(divisor, (10 - 5 + 1) * (13 - 4 + 1))
        self.screenshot("05-rectangle-region")

        # Scan bin, detector bin and crop: a new plan, its own image, mask and mean pattern.
        self.driver.execute_script("""
            document.getElementById('scan-bin').value = 2;
            document.getElementById('det-bin').value = 2;
            document.getElementById('crop-row-start').value = 4;
            document.getElementById('crop-row-stop').value = 36;
            document.getElementById('plan-form').requestSubmit();""")
        shapes = self.wait_for("""(() => {
            const s = window.quantemViewer.state;
            if (!s.realspace || !s.diffraction || !s.mask) return null;
            return [s.realspace.image.height, s.realspace.image.width, s.diffraction.image.height,
                    s.diffraction.image.width, s.realspace.params.row_start, s.diffraction.image.divisor];
        })()""", "the binned and cropped plan's images")
        self.assertEqual(shapes, [16, SCAN[1] // 2, DETECTOR[0] // 2, DETECTOR[1] // 2, 4, 16 * SCAN[1] // 2])
        self.assertGreater(self.canvas_variance("realspace-canvas"), 0)
        self.screenshot("06-binned-cropped")

        # No script error, content-security-policy violation or failed load on the way.
        severe = [entry["message"] for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]
        self.assertEqual(severe, [])

    def test_5_product_strip_from_one_request_switches_the_main_image(self):
        self.browser_log()  # drains what earlier tests left (test_4's expected 409)
        self.open_page()
        self.open_acquisition()
        modes = ["BF", "ABF", "ADF", "CoMx", "CoMy", "iCoM"]
        shown = self.wait_for("""(() => {
            const thumbs = Array.from(document.querySelectorAll('#product-strip .product-thumb'));
            return thumbs.length === 6 ? thumbs.map(t => t.dataset.mode) : null;
        })()""", "the six product thumbnails")
        self.assertEqual(shown, modes)
        # One products request for the whole strip, and no single request for a thumbnail.
        paths = self.driver.execute_script(
            "return window.quantemViewer.state.requests.map(r => [r.path, r.query]);")
        self.assertEqual(sum(1 for path, _ in paths if path == "/api/browse/products"), 1, paths)
        # The raw bundle: no per-byte encoding on the daemon, no base64 decoding here.
        self.assertTrue(all("format=raw" in query for path, query in paths if path == "/api/browse/products"), paths)
        self.assertEqual([query for path, query in paths if path == "/api/browse/realspace"],
                         [query for path, query in paths if path == "/api/browse/realspace" and "mode=BF" in query])
        for mode in modes:
            self.assertGreater(self.driver.execute_script(
                f"return document.querySelector('.product-thumb[data-mode={mode}] canvas').width;"), 1, mode)
        # Each thumbnail holds the daemon's exact image of its mode (the viewer's radii).
        radii = {"ABF": "&inner=0.5&outer=1", "ADF": "&inner=1&outer=3"}
        for mode in modes:
            _, headers, raw = self.daemon.get(
                f"/api/browse/realspace?session={SESSION}&file={MASTER}&mode={mode}{radii.get(mode, '')}")
            dtype = {k.lower(): v for k, v in headers.items()}["x-dtype"]
            direct = list(struct.unpack(f"<{len(raw) // 4}{'I' if dtype == '<u4' else 'f'}", raw))
            thumb = self.driver.execute_script(
                "return Array.from(window.quantemViewer.state.products.images.find(i => i.mode === arguments[0]).data);",
                mode)
            self.assertEqual(thumb, direct, mode)
        self.assertTrue(self.driver.execute_script(
            "return document.querySelector('.product-thumb[data-mode=BF]').classList.contains('active');"))
        self.screenshot("07-product-strip")
        # A click on a thumbnail makes it the main image.
        frame = self.driver.execute_script("return document.getElementById('realspace-canvas').dataset.frame;")
        self.driver.execute_script("document.querySelector('.product-thumb[data-mode=ADF]').click();")
        self.wait_for(f"""(() => {{
            const r = window.quantemViewer.state.realspace;
            return r && r.params.mode === 'ADF' && document.getElementById('realspace-canvas').dataset.frame !== '{frame}';
        }})()""", "the ADF image in the main view")
        self.assertEqual(self.driver.execute_script("return document.getElementById('mode-select').value;"), "ADF")
        self.assertTrue(self.driver.execute_script(
            "return document.querySelector('.product-thumb[data-mode=ADF]').classList.contains('active')"
            " && !document.querySelector('.product-thumb[data-mode=BF]').classList.contains('active');"))
        main = self.driver.execute_script("return Array.from(window.quantemViewer.state.realspace.image.data);")
        strip = self.driver.execute_script(
            "return Array.from(window.quantemViewer.state.products.images.find(i => i.mode === 'ADF').data);")
        self.assertEqual(main, strip)
        self.screenshot("08-product-clicked")
        severe = [entry["message"] for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]
        self.assertEqual(severe, [])

    def test_4_export_without_an_export_folder_says_how_to_enable_it(self):
        self.open_page()
        self.open_acquisition()
        self.driver.execute_script("document.getElementById('export-button').click();")
        text = self.wait_for("(() => { const t = document.getElementById('export-status');"
                             " return t.classList.contains('error-text') ? t.textContent : null; })()",
                             "the export-disabled message")
        self.assertIn("--export-dir", text)

    def test_3_a_512_image_draws_within_a_frame(self):
        # The drawing path of a real-space answer (percentiles, colour map,
        # putImageData) on a 512x512 image; one frame is 16.7 ms, the bound is generous.
        self.open_page()
        elapsed = self.driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            const v = window.quantemViewer;
            const values = new Uint32Array(512 * 512);
            for (let i = 0; i < values.length; i++) values[i] = (i * 2654435761) >>> 20;
            const canvas = document.createElement('canvas');
            canvas.width = 512; canvas.height = 512;
            const context = canvas.getContext('2d');
            const image = context.createImageData(512, 512);
            let best = Infinity;
            for (let round = 0; round < 10; round++) {
              const t0 = performance.now();
              const [low, high] = v.percentiles(values, [0.5, 99.5]);
              v.renderInto(image, values, low, high, v.lookupTable('viridis'));
              context.putImageData(image, 0, 0);
              best = Math.min(best, performance.now() - t0);
            }
            done(best);""")
        print(f"512x512 draw: {elapsed:.1f} ms", file=sys.stderr)
        self.assertLess(elapsed, 50.0)


class ViewerExport(BrowserCase):
    export_dir = True

    def test_1_export_this_plan_shows_progress_and_where_it_went(self):
        self.open_page()
        self.open_acquisition()
        self.driver.execute_script("""
            document.getElementById('scan-bin').value = 2;
            document.getElementById('plan-form').requestSubmit();""")
        self.wait_for("(() => { const s = window.quantemViewer.state;"
                      " return s.realspace && s.realspace.params.scan_bin === 2; })()", "the binned plan")
        self.driver.execute_script("document.getElementById('export-button').click();")
        text = self.wait_for("(() => { const t = document.getElementById('export-status').textContent;"
                             " return /^exported to|^export (failed|cancelled)/.test(t) ? t : null; })()",
                             "the export's result")
        name = "demo_scanbin2"
        folder = os.path.join(self.exports, name)
        self.assertIn(f"exported to {folder}", text)
        self.assertTrue(os.path.exists(os.path.join(folder, f"{name}_master.h5")))
        self.assertTrue(os.path.exists(os.path.join(folder, f"{name}_data_000001.h5")))
        self.assertEqual([n for n in os.listdir(self.exports) if n.startswith(".")], [])
        # The export folder is inside the data folder: the refreshed list shows it.
        self.wait_for(f"document.querySelector(`.acquisition[data-file='{name}_master.h5']`)",
                      "the export in the acquisition list")
        self.screenshot("09-exported")

        # The same plan again: the daemon never overwrites; the page says so.
        self.driver.execute_script("document.getElementById('export-button').click();")
        text = self.wait_for("(() => { const t = document.getElementById('export-status');"
                             " return t.classList.contains('error-text') ? t.textContent : null; })()",
                             "the collision message")
        self.assertIn("already exists", text)
class ViewerWhileCataloguing(BrowserCase):
    """The first catalog build is held by a master whose inspection hangs
    until its deadline: the page lists what is known with a note, then the
    whole catalog without it."""

    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="quantem-viewer-test-")
        cls.data = os.path.join(cls.work, "data")
        for prefix in ("demo", "zz"):
            subprocess.run([ARGS.binary, "synth", os.path.join(cls.data, SESSION), "--prefix", prefix, "--scan", "4x4",
                            "--detector", "8x8"], check=True, stdout=subprocess.DEVNULL)
        cls.daemon = Daemon(cls.data, cls.work, ("--inspect-workers", "1", "--inspect-timeout", "15"),
                            {"QUANTEM_TEST_INSPECTOR_HANG_ON": "zz_master.h5"}, wait_ready=False)
        cls.driver = start_browser(os.path.join(cls.work, "profile"))
        cls.driver.set_script_timeout(30)

    def test_1_a_growing_list_with_a_note(self):
        self.open_page()
        note = self.wait_for("(() => { const n = document.getElementById('cataloguing-note');"
                             " return n && document.querySelector('.acquisition') ? n.textContent : null; })()",
                             "the partial list and its note", timeout=20)
        self.assertIn("Still cataloguing", note)
        names = self.driver.execute_script(
            "return [...document.querySelectorAll('.acquisition')].map(b => b.dataset.file);")
        self.assertEqual(names, ["demo_master.h5"])
        self.screenshot("10-still-cataloguing")
        self.wait_for("!document.getElementById('cataloguing-note')"
                      " && document.querySelectorAll('.acquisition').length === 2",
                      "the whole catalog without the note", timeout=30)


class ViewerWithToken(BrowserCase):
    auth_args = ("--auth", "token")
    auth_env = {"QUANTEM_GPU_TOKEN": TOKEN}

    def test_1_token_from_the_fragment(self):
        self.open_page(f"#token={TOKEN}")
        self.open_acquisition()
        self.assertGreater(self.canvas_variance("realspace-canvas"), 0)
        self.assertNotIn(TOKEN, self.driver.current_url, "the token stays in the address bar")
        self.assertNotIn(TOKEN, self.daemon.output(), "the token reached the daemon's log")
        self.screenshot("07-token-accepted")

    def test_2_wrong_token_is_explained(self):
        self.open_page("#token=not-the-token")
        text = self.wait_for("(() => { const b = document.getElementById('banner');"
                             " return !b.hidden && b.dataset.kind === 'token-rejected' ? b.textContent : null; })()",
                             "the wrong-token message")
        self.assertIn("refused the token", text)
        self.screenshot("08-token-rejected")

    def test_3_missing_token_is_explained(self):
        self.open_page()
        self.driver.execute_script("sessionStorage.clear();")
        self.open_page()
        text = self.wait_for("(() => { const b = document.getElementById('banner');"
                             " return !b.hidden && b.dataset.kind === 'token-required' ? b.textContent : null; })()",
                             "the token-required message")
        self.assertIn("--auth token", text)


def run_main(module):
    """Runs the unittest cases of `module` (this file's, or another browser
    test's that imports these helpers) with --binary and --artifacts."""
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--artifacts", required=True)
    ARGS, rest = parser.parse_known_args()
    missing = missing_tools()
    if missing:
        message = f"viewer browser test: missing {', '.join(missing)} (scripts/install-deps.sh --test installs them)"
        if os.environ.get("QUANTEM_BROWSER_TEST_REQUIRED") == "1":
            print(message, file=sys.stderr)
            return 1
        print(message + "; skipped", file=sys.stderr)
        return SKIP
    if not os.path.exists(ARGS.binary):
        print(f"viewer browser test: {ARGS.binary} is not built", file=sys.stderr)
        return 1
    shutil.rmtree(ARGS.artifacts, ignore_errors=True)  # this run's screenshots only
    program = unittest.main(module=module, argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(run_main(sys.modules[__name__]))
