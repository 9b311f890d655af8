#!/usr/bin/env python3
"""The viewer's controls in headless Chromium against the real daemon
(`serve --backend cpu`) on a calibrated `synth` acquisition (scan step
2.5 Å, detector pixel 0.75 mrad: `synth --scan-sampling-A --k-pixel-size-mrad`).

  viewer_controls_test.py --binary build/src/cli/quantem-gpu --artifacts DIR

Checks: export takes the plan the form shows; the export status clears when the
plan changes and never wraps; the hover marker shows on bright areas; the
scale bars' lengths against scan_sampling_A and k_pixel_size_mrad, and the
hover readouts in nm and mrad; the error banner clears when the daemon comes
back, and polls back off while it is away. Screenshots go to DIR.
"""
import json
import os
import re
import signal
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import viewer_browser_test as base  # noqa: E402  (the daemon and browser helpers)

SAMPLING_A = 2.5
K_MRAD = 0.75
CALIBRATION = ("--scan-sampling-A", str(SAMPLING_A), "--k-pixel-size-mrad", str(K_MRAD))
# The microscope the metadata panel reports (synth's defaults are 300 kV and 0.115 m).
HIGH_TENSION_V = 200000.0
CAMERA_LENGTH_M = 0.245
INSTRUMENT = ("--high-tension-V", str(HIGH_TENSION_V), "--camera-length-m", str(CAMERA_LENGTH_M))


def decode_png(data):
    """A screenshot's PNG (8-bit RGB or RGBA, not interlaced) -> (width, height, rows of RGB tuples)."""
    import struct
    import zlib
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks, header = 8, [], None
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        position += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    channels = 4 if color == 6 else 3
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                estimate = left + up - corner
                pa, pb, pc = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, channels)])
        previous = line
    return width, height, rows


def label_value(label):
    """'2 nm' -> 20.0 (Å), '5 Å' -> 5.0, '10 mrad' -> 10.0."""
    number, unit = label.split(" ")
    return float(number) * {"nm": 10.0, "Å": 1.0, "mrad": 1.0}[unit]


class ViewerControls(base.BrowserCase):
    export_dir = True
    synth_args = CALIBRATION + INSTRUMENT

    def setUp(self):
        self.open_page()
        self.open_acquisition()

    def bar_run(self, which):
        """The drawn scale bar: its white run's length on the overlay, measured
        from the canvas pixels, and what the page says it drew."""
        return self.driver.execute_script("""
            const bar = window.quantemViewer.state.scaleBars[arguments[0]];
            if (!bar) return null;
            const overlay = document.getElementById(arguments[0] + '-overlay');
            const y = bar.y + Math.floor(bar.thickness / 2);
            const row = overlay.getContext('2d').getImageData(0, y, overlay.width, 1).data;
            const white = (x) => row[4 * x] > 240 && row[4 * x + 1] > 240 && row[4 * x + 2] > 240 && row[4 * x + 3] > 240;
            let x = bar.x0;
            while (x < overlay.width && white(x)) x++;
            return {label: bar.label, measured: x - bar.x0, overlayWidth: overlay.width, imageWidth: bar.imageWidth};""",
                                          which)

    def check_bar(self, which, unit_size):
        bar = self.wait_for(f"window.quantemViewer.state.scaleBars.{which}", f"the {which} scale bar")
        run = self.bar_run(which)
        # The label's length in image pixels, at the displayed pixels per image pixel.
        expected = label_value(run["label"]) / unit_size * run["overlayWidth"] / run["imageWidth"] * bar["zoom"]
        self.assertGreater(run["measured"], 10, run)
        self.assertLessEqual(abs(run["measured"] - expected), 1.5, (run, expected, bar))
        return run

    def test_1_catalog_reports_the_synth_calibration(self):
        _, _, body = self.daemon.get("/api/browse/sessions")
        files = [f for s in json.loads(body)["sessions"] for f in s["files"]]
        self.assertEqual([(f["scan_sampling_A"], f["k_pixel_size_mrad"], f["cal"]) for f in files],
                         [(SAMPLING_A, K_MRAD, "ok")])
        meta = self.driver.execute_script("return document.getElementById('acquisition-meta').textContent;")
        self.assertIn("scan step 2.5 Å", meta)
        self.assertIn("detector pixel 0.75 mrad", meta)

    def test_2_scale_bars_match_the_calibration(self):
        run = self.check_bar("realspace", SAMPLING_A)
        self.assertEqual(run["label"], "2 nm")  # a quarter of 48 x 2.5 Å = 30 Å, rounded down to 1-2-5
        run = self.check_bar("diffraction", K_MRAD)
        self.assertEqual(run["label"], "10 mrad")  # a quarter of 64 x 0.75 mrad = 12 mrad
        self.screenshot("controls-01-scale-bars")
        # Binned: each displayed pixel is 2 scan steps and 2 detector pixels.
        self.driver.execute_script("""
            document.getElementById('scan-bin').value = 2;
            document.getElementById('det-bin').value = 2;
            document.getElementById('plan-form').requestSubmit();""")
        self.wait_for("(() => { const s = window.quantemViewer.state; return s.realspace && s.diffraction"
                      " && s.realspace.image.width === 24 && s.diffraction.image.width === 32; })()", "the binned plan")
        self.check_bar("realspace", 2 * SAMPLING_A)
        self.check_bar("diffraction", 2 * K_MRAD)
        self.screenshot("controls-02-scale-bars-binned")

    def test_3_hover_readouts_in_nm_and_mrad(self):
        rect = self.driver.execute_script(
            "const r = document.getElementById('realspace-overlay').getBoundingClientRect();"
            "return [r.left, r.top, r.width, r.height];")
        row, col = 6, 20
        self.mouse("mouseMoved", rect[0] + (col + 0.5) * rect[2] / base.SCAN[1],
                   rect[1] + (row + 0.5) * rect[3] / base.SCAN[0])
        text = self.wait_for("document.getElementById('realspace-readout').dataset.hover === '6,20'"
                             " && document.getElementById('realspace-readout').textContent", "the real-space readout")
        self.assertIn(f"y {row * SAMPLING_A / 10:g} nm, x {col * SAMPLING_A / 10:g} nm", text)
        # Diffraction: the pixel 9 columns right of the mask centre's pixel, in mrad from the centre.
        geometry = self.driver.execute_script("""
            const s = window.quantemViewer.state;
            const r = document.getElementById('diffraction-overlay').getBoundingClientRect();
            return {row: s.mask.row, col: s.mask.col, width: s.diffraction.image.width, height: s.diffraction.image.height,
                    left: r.left, top: r.top, cssWidth: r.width, cssHeight: r.height};""")
        pixel_row, pixel_col = round(geometry["row"]), round(geometry["col"]) + 9
        self.mouse("mouseMoved", geometry["left"] + (pixel_col + 0.5) * geometry["cssWidth"] / geometry["width"],
                   geometry["top"] + (pixel_row + 0.5) * geometry["cssHeight"] / geometry["height"])
        k = self.wait_for(f"document.getElementById('diffraction-readout').dataset.hover === '{pixel_row},{pixel_col}'"
                          " && document.getElementById('diffraction-readout').dataset.k", "the diffraction readout")
        expected = ((pixel_row - geometry["row"]) ** 2 + (pixel_col - geometry["col"]) ** 2) ** 0.5 * K_MRAD
        self.assertAlmostEqual(float(k), expected, places=6)
        self.assertIn("mrad from the centre", self.driver.execute_script(
            "return document.getElementById('diffraction-readout').textContent;"))
        self.screenshot("controls-03-hover-units")

    def test_4_hover_marker_shows_on_bright_areas(self):
        # The hover marker has a dark casing under its white line: both show.
        rect = self.driver.execute_script(
            "const r = document.getElementById('realspace-overlay').getBoundingClientRect();"
            "return [r.left, r.top, r.width, r.height];")
        row, col = 3, 40
        self.mouse("mouseMoved", rect[0] + (col + 0.5) * rect[2] / base.SCAN[1],
                   rect[1] + (row + 0.5) * rect[3] / base.SCAN[0])
        self.wait_for("window.quantemViewer.state.hover && window.quantemViewer.state.hover.col === 40", "the hover")
        dark, light = self.driver.execute_script("""
            const overlay = document.getElementById('realspace-overlay');
            const sx = overlay.width / 48, sy = overlay.height / 40;
            const x0 = Math.floor((40 + 0.5) * sx - 3 * sx), y0 = Math.floor((3 + 0.5) * sy - 3 * sy);
            const data = overlay.getContext('2d').getImageData(x0, Math.max(0, y0), Math.ceil(6 * sx), Math.ceil(6 * sy)).data;
            let dark = 0, light = 0;
            for (let i = 0; i < data.length; i += 4) {
              if (data[i + 3] < 200) continue;
              const level = (data[i] + data[i + 1] + data[i + 2]) / 3;
              if (level < 60) dark++;
              if (level > 200) light++;
            }
            return [dark, light];""")
        self.assertGreater(light, 0)
        self.assertGreater(dark, 0, "no dark casing: the marker vanishes on bright areas")

    def test_5_export_takes_the_plan_the_form_shows_and_its_status_stays_put(self):
        panels_top = self.driver.execute_script("return document.querySelector('.panels').getBoundingClientRect().top;")
        # A crop typed, not applied: the export is of the crop, and the images follow it.
        self.driver.execute_script("""
            document.getElementById('crop-row-start').value = 4;
            document.getElementById('crop-row-stop').value = 20;""")
        self.driver.execute_script("document.getElementById('export-button').click();")
        text = self.wait_for("(() => { const t = document.getElementById('export-status').textContent;"
                             " return /^exported to|^export (failed|cancelled)/.test(t) ? t : null; })()",
                             "the export's result")
        name = "demo_crop4-20x0-48"
        self.assertIn(os.path.join(self.exports, name), text)
        posts = self.driver.execute_script(
            "return window.quantemViewer.state.requests.filter(r => r.path === '/api/browse/export'"
            " && r.method === 'POST').map(r => r.query);")
        self.assertIn("row_start=4", posts[-1])
        self.assertIn("row_stop=20", posts[-1])
        self.wait_for("(() => { const r = window.quantemViewer.state.realspace;"
                      " return r && r.params.row_start === 4 && r.image.height === 16; })()", "the crop's image")
        # The same plan again: the daemon's long "already exists" stays on one line.
        self.driver.execute_script("document.getElementById('export-button').click();")
        self.wait_for("document.getElementById('export-status').classList.contains('error-text')", "the collision text")
        status = self.driver.execute_script("""
            const s = document.getElementById('export-status');
            return {height: s.getBoundingClientRect().height, title: s.title,
                    panelsTop: document.querySelector('.panels').getBoundingClientRect().top};""")
        self.assertIn("already exists", status["title"])
        self.assertLess(status["height"], 24, status)
        self.assertEqual(status["panelsTop"], panels_top)
        self.screenshot("controls-04-export-status-one-line")
        # Another plan: the status of the old one goes.
        self.driver.execute_script("""
            document.getElementById('scan-bin').value = 2;
            document.getElementById('plan-form').requestSubmit();""")
        self.wait_for("document.getElementById('export-status').textContent === ''", "the stale status cleared")


    def test_6_contrast_by_hand_is_kept_per_product(self):
        # BF with gamma 0.5, then its high limit dragged to the left on the histogram.
        self.driver.execute_script("""
            const scale = document.getElementById('realspace-scale');
            scale.value = 'gamma'; scale.dispatchEvent(new Event('input'));
            const gamma = document.getElementById('realspace-gamma');
            gamma.value = 0.5; gamma.dispatchEvent(new Event('input'));""")
        geometry = self.driver.execute_script("""
            const canvas = document.getElementById('realspace-histogram');
            canvas.scrollIntoView({block: 'center'});
            const r = canvas.getBoundingClientRect();
            return {left: r.left, top: r.top, width: r.width, height: r.height, range: canvas.range,
                    limits: window.quantemViewer.state.realspace.limits};""")
        low, high = geometry["limits"]
        minimum, maximum = geometry["range"]
        start_x = geometry["left"] + (high - minimum) / (maximum - minimum) * geometry["width"]
        end_x = start_x - 0.3 * geometry["width"]
        y = geometry["top"] + geometry["height"] / 2
        self.mouse("mouseMoved", start_x, y)
        self.mouse("mousePressed", start_x, y, buttons=1)
        self.mouse("mouseMoved", (start_x + end_x) / 2, y, buttons=1)
        self.mouse("mouseMoved", end_x, y, buttons=1)
        self.mouse("mouseReleased", end_x, y)
        expected_high = minimum + (end_x - geometry["left"]) / geometry["width"] * (maximum - minimum)
        shown = self.wait_for("(() => { const s = window.quantemViewer.state;"
                              " return s.display.BF && s.display.BF.manual ? s.realspace.limits : null; })()",
                              "the dragged limit")
        self.assertEqual(shown[0], low)
        self.assertAlmostEqual(shown[1], expected_high, delta=(maximum - minimum) / geometry["width"])
        # Every pixel: gray level round(255 (L / 255)^0.5), L the linear level between the limits.
        values, pixels = self.driver.execute_script("""
            const canvas = document.getElementById('realspace-canvas');
            const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
            const red = [];
            for (let i = 0; i < data.length; i += 4) red.push(data[i]);
            return [Array.from(window.quantemViewer.state.realspace.image.data), red];""")
        low, high = shown
        for value, pixel in zip(values, pixels):
            level = min(255, max(0, int((value - low) * (255 / (high - low))))) if value > low else 0
            self.assertLessEqual(abs(pixel - round(255 * (level / 255) ** 0.5)), 1, (value, pixel))
        bar = self.driver.execute_script(
            "const c = document.getElementById('realspace-colorbar'); return [c.dataset.low, c.dataset.high];")
        self.assertEqual([float(v) for v in bar], shown)
        self.assertGreater(self.canvas_variance("realspace-colorbar"), 0)
        self.screenshot("controls-05-contrast-by-hand")
        # ADF has its own settings; BF's come back with it.
        self.driver.execute_script("const m = document.getElementById('mode-select'); m.value = 'ADF';"
                                   " m.dispatchEvent(new Event('change'));")
        self.wait_for("window.quantemViewer.state.realspace.params.mode === 'ADF'", "the ADF image")
        self.assertEqual(self.driver.execute_script("return document.getElementById('realspace-scale').value;"), "linear")
        self.assertIsNone(self.driver.execute_script("return window.quantemViewer.state.display.ADF.manual;"))
        self.driver.execute_script("const m = document.getElementById('mode-select'); m.value = 'BF';"
                                   " m.dispatchEvent(new Event('change'));")
        self.wait_for("window.quantemViewer.state.realspace.params.mode === 'BF'", "the BF image again")
        self.assertEqual(self.driver.execute_script("return document.getElementById('realspace-scale').value;"), "gamma")
        self.assertEqual(self.driver.execute_script("return window.quantemViewer.state.realspace.limits;"), shown)

    def test_7_keyboard_steps_the_probe_and_the_product(self):
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys
        rect = self.driver.execute_script(
            "const r = document.getElementById('realspace-overlay').getBoundingClientRect();"
            "return [r.left, r.top, r.width, r.height];")
        self.driver.execute_script("document.getElementById('follow-pointer').checked = false;")
        x, y = rect[0] + 30.5 * rect[2] / base.SCAN[1], rect[1] + 7.5 * rect[3] / base.SCAN[0]
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y, buttons=1)
        self.mouse("mouseReleased", x, y)
        self.wait_for("window.quantemViewer.state.pinned.row === 7", "the clicked position")
        ActionChains(self.driver).send_keys(Keys.ARROW_RIGHT).key_down(Keys.SHIFT).send_keys(Keys.ARROW_DOWN) \
            .key_up(Keys.SHIFT).perform()
        expected = json.dumps({"kind": "position", "row": 17, "col": 31}, separators=(",", ":"))
        self.wait_for(f"document.getElementById('diffraction-canvas').dataset.source === {json.dumps(expected)}",
                      "the pattern 10 rows down and 1 column right")
        ActionChains(self.driver).send_keys("]").perform()
        self.wait_for("window.quantemViewer.state.realspace.params.mode === 'ABF'", "the next product")
        ActionChains(self.driver).send_keys("[").send_keys("[").perform()
        self.wait_for("window.quantemViewer.state.realspace.route.endsWith('realspace-shape')", "the previous products")
        self.screenshot("controls-06-keyboard")


    def test_8_line_and_radial_profiles(self):
        rect = self.driver.execute_script(
            "const r = document.getElementById('realspace-overlay').getBoundingClientRect();"
            "return [r.left, r.top, r.width, r.height];")
        self.driver.execute_script("document.getElementById('follow-pointer').checked = false;"
                                   "document.getElementById('tool-select').value = 'line';")
        point = lambda row, col: (rect[0] + (col + 0.5) * rect[2] / base.SCAN[1],  # noqa: E731
                                  rect[1] + (row + 0.5) * rect[3] / base.SCAN[0])
        x0, y0 = point(5, 4)
        x1, y1 = point(5, 30)
        self.mouse("mouseMoved", x0, y0)
        self.mouse("mousePressed", x0, y0, buttons=1)
        self.mouse("mouseMoved", (x0 + x1) / 2, y0, buttons=1)
        self.mouse("mouseMoved", x1, y1, buttons=1)
        self.mouse("mouseReleased", x1, y1)
        profile = self.wait_for("(() => { const p = window.quantemViewer.state.profile;"
                                " return p && p.kind === 'line' ? {x: Array.from(p.x), y: Array.from(p.y)} : null; })()",
                                "the line profile")
        image = self.driver.execute_script("return Array.from(window.quantemViewer.state.realspace.image.data);")
        # Row 5, columns 4 to 30: the daemon's exact values, 2.5 Å (0.25 nm) apart.
        self.assertEqual(profile["y"], image[5 * base.SCAN[1] + 4: 5 * base.SCAN[1] + 31])
        self.assertEqual(profile["x"], [i * SAMPLING_A / 10 for i in range(27)])
        self.assertGreater(self.canvas_variance("profile-plot"), 0)
        self.driver.execute_script("document.getElementById('profile-panel').scrollIntoView({block: 'end'});")
        self.screenshot("controls-07-line-profile")
        downloads = os.path.join(self.work, "downloads")
        os.makedirs(downloads, exist_ok=True)
        self.driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": downloads})
        self.driver.execute_script("document.getElementById('save-profile-csv').click();")
        csv_path = os.path.join(downloads, "demo_line-profile-BF_s1d1.csv")
        deadline = time.time() + 20
        while not os.path.exists(csv_path) and time.time() < deadline:
            time.sleep(0.1)
        with open(csv_path) as csv:
            lines = [line for line in csv.read().splitlines() if not line.startswith("#")]
        self.assertEqual(lines[0], "distance_nm,value")
        self.assertEqual([float(line.split(",")[1]) for line in lines[1:]], profile["y"])
        # The radial average of the mean pattern about the mask centre, in mrad.
        self.driver.execute_script("document.getElementById('show-radial').click();")
        radial = self.wait_for("(() => { const p = window.quantemViewer.state.profile;"
                               " return p && p.kind === 'radial' ? {x: Array.from(p.x), y: Array.from(p.y),"
                               " centre: p.centre} : null; })()", "the radial profile")
        pattern = self.driver.execute_script(
            "const d = window.quantemViewer.state.diffraction.image;"
            " return {data: Array.from(d.data), width: d.width, height: d.height, divisor: d.divisor};")
        import numpy
        values = numpy.array(pattern["data"], dtype=numpy.float64).reshape(pattern["height"], pattern["width"])
        rows, cols = numpy.indices(values.shape)
        bins = numpy.floor(numpy.hypot(cols - radial["centre"]["col"], rows - radial["centre"]["row"]) + 0.5).astype(int)
        present = sorted(set(bins.ravel().tolist()))
        expected = [values[bins == b].sum() / (bins == b).sum() / pattern["divisor"] for b in present]
        self.assertEqual(radial["x"], [b * K_MRAD for b in present])
        for got, want in zip(radial["y"], expected):
            self.assertAlmostEqual(got, want, delta=1e-9 * max(1.0, abs(want)))
        self.driver.execute_script("document.getElementById('profile-panel').scrollIntoView({block: 'end'});")
        self.screenshot("controls-08-radial-profile")


    def test_9_zoom_is_pixel_exact_and_clicks_follow_it(self):
        stack = self.driver.execute_script(
            "const r = document.getElementById('realspace-overlay').getBoundingClientRect();"
            "return [r.left, r.top, r.width, r.height];")
        centre = (stack[0] + stack[2] / 2, stack[1] + stack[3] / 2)
        for _ in range(3):  # three wheel steps about the image's centre
            self.driver.execute_cdp_cmd("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": centre[0], "y": centre[1],
                                                                     "deltaX": 0, "deltaY": -400})
        view = self.wait_for("(() => { const v = window.quantemViewer.state.view.realspace;"
                             " return v.zoom > 4 ? v : null; })()", "the zoomed view")
        # The point under the pointer stayed there: the image centre is still at the stack's centre.
        self.assertAlmostEqual((stack[2] / 2 - view["tx"]) / view["zoom"], stack[2] / 2, delta=1.0)  # whole CSS pixels
        # The scale bar now spans a quarter of what is in view, at the zoomed scale.
        self.check_bar("realspace", SAMPLING_A)
        # Pixel exact: every screen pixel inside an image pixel's block has that pixel's colour.
        per_pixel = stack[2] / base.SCAN[1] * view["zoom"]
        width, height, rows = decode_png(self.driver.get_screenshot_as_png())
        colours = self.driver.execute_script("""
            const c = document.getElementById('realspace-canvas');
            return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data);""")
        checked = 0
        for row, col in [(19, 23), (20, 24), (18, 25), (21, 22)]:
            x0 = stack[0] + view["tx"] + col * per_pixel
            y0 = stack[1] + view["ty"] + row * per_pixel
            expected = tuple(colours[4 * (row * base.SCAN[1] + col):4 * (row * base.SCAN[1] + col) + 3])
            for y in range(int(y0) + 2, int(y0 + per_pixel) - 1):
                for x in range(int(x0) + 2, int(x0 + per_pixel) - 1):
                    self.assertEqual(rows[y][x], expected, (row, col, x, y))
                    checked += 1
        self.assertGreater(checked, 400)
        self.screenshot("controls-09-zoomed")
        # A click lands on the image pixel under it.
        self.driver.execute_script("document.getElementById('follow-pointer').checked = false;")
        x = stack[0] + view["tx"] + 22.5 * per_pixel
        y = stack[1] + view["ty"] + 18.5 * per_pixel
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y, buttons=1)
        self.mouse("mouseReleased", x, y)
        self.wait_for("window.quantemViewer.state.pinned.row === 18 && window.quantemViewer.state.pinned.col === 22",
                      "the clicked pixel at this zoom")
        # Shift + drag pans by the drag.
        self.driver.execute_cdp_cmd("Input.dispatchMouseEvent", {"type": "mousePressed", "x": x, "y": y, "button": "left",
                                                                 "buttons": 1, "clickCount": 1, "modifiers": 8})
        self.driver.execute_cdp_cmd("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x + 40, "y": y + 25,
                                                                 "button": "left", "buttons": 1, "modifiers": 8})
        self.driver.execute_cdp_cmd("Input.dispatchMouseEvent", {"type": "mouseReleased", "x": x + 40, "y": y + 25,
                                                                 "button": "left", "buttons": 0, "clickCount": 1,
                                                                 "modifiers": 8})
        panned = self.driver.execute_script("return window.quantemViewer.state.view.realspace;")
        self.assertAlmostEqual(panned["tx"], view["tx"] + 40, delta=0.01)
        self.assertAlmostEqual(panned["ty"], view["ty"] + 25, delta=0.01)
        self.assertEqual(self.driver.execute_script("return window.quantemViewer.state.pinned.row;"), 18)
        # Double click: the whole image again.
        self.driver.execute_script("document.getElementById('realspace-overlay')"
                                   ".dispatchEvent(new MouseEvent('dblclick', {bubbles: true}));")
        self.assertEqual(self.driver.execute_script("return window.quantemViewer.state.view.realspace.zoom;"), 1)


    def test_10_figure_export_with_scale_bar_and_colour_bar(self):
        downloads = os.path.join(self.work, "figures")
        os.makedirs(downloads, exist_ok=True)
        self.driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": downloads})
        self.driver.execute_script("document.getElementById('save-figure').click();")
        path = os.path.join(downloads, "demo_BF_s1d1_figure.png")
        deadline = time.time() + 20
        while not os.path.exists(path) and time.time() < deadline:
            time.sleep(0.1)
        with open(path, "rb") as figure_file:
            width, height, rows = decode_png(figure_file.read())
        figure = self.driver.execute_script("return window.quantemViewer.state.lastFigure;")
        factor = figure["factor"]
        self.assertEqual(factor, 11)  # 48 x 40 enlarged to at least 512 on its longer side
        self.assertEqual((width, height), (figure["width"], figure["height"]))
        # The image: each source pixel a block of its own colour.
        colours = self.driver.execute_script("""
            const c = document.getElementById('realspace-canvas');
            return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data);""")
        for row, col in [(0, 47), (3, 30), (10, 40), (20, 20)]:
            expected = tuple(colours[4 * (row * base.SCAN[1] + col):4 * (row * base.SCAN[1] + col) + 3])
            for dy in range(1, factor - 1):
                for dx in range(1, factor - 1):
                    self.assertEqual(rows[figure["imageTop"] + row * factor + dy][figure["imageLeft"] + col * factor + dx],
                                     expected, (row, col))
        # The scale bar: its white run is its label's length at the figure's scale.
        bar = figure["bar"]
        y = bar["y"] + bar["thickness"] // 2
        x = bar["x0"]
        while rows[y][x] == (255, 255, 255):
            x += 1
        expected_length = label_value(bar["label"]) / SAMPLING_A * factor
        self.assertLessEqual(abs((x - bar["x0"]) - expected_length), 1, (bar, x))
        # The colour bar: gray from black to white, never darker to the right.
        strip = rows[figure["colorbar"]["y"] + figure["colorbar"]["height"] // 2][
            figure["colorbar"]["x0"]:figure["colorbar"]["x1"]]
        levels = [pixel[0] for pixel in strip]
        self.assertLess(levels[0], 5)
        self.assertGreater(levels[-1], 250)
        self.assertEqual(levels, sorted(levels))
        shutil_copy = os.path.join(base.ARGS.artifacts, "controls-10-figure.png")
        os.makedirs(base.ARGS.artifacts, exist_ok=True)
        with open(path, "rb") as source, open(shutil_copy, "wb") as target:
            target.write(source.read())


    def test_11_metadata_panel(self):
        self.driver.execute_script("document.getElementById('metadata-panel').open = true;")
        self.wait_for("document.getElementById('residency-state').textContent.startsWith('resident')", "resident")
        rows = self.wait_for("""(() => {
            const terms = [...document.querySelectorAll('#metadata-list dt')].map(t => t.textContent);
            const values = [...document.querySelectorAll('#metadata-list dd')].map(d => d.textContent);
            const rows = Object.fromEntries(terms.map((t, i) => [t, values[i]]));
            return rows['bright-field fit'] && rows['encoding'] ? rows : null;
        })()""", "the metadata")
        self.assertEqual(rows["path"], f"{base.SESSION}/{base.MASTER}")
        self.assertEqual(rows["scan"], f"{base.SCAN[0]} × {base.SCAN[1]} positions")
        self.assertEqual(rows["scan_sampling_A"], "2.5 Å (2.5 Å)")
        self.assertEqual(rows["k_pixel_size_mrad"], "0.75 mrad")
        self.assertEqual(rows["masked pixels"], "3")  # synth's bad pixels
        _, headers, _ = self.daemon.get(f"/api/browse/realspace?session={base.SESSION}&file={base.MASTER}&mode=BF")
        provenance = json.loads({k.lower(): v for k, v in headers.items()}["x-quantem-provenance"])
        fit = provenance["geometry"]["bright_field"]
        self.assertIn(f"centre row {fit['center_row']:.2f}, column {fit['center_col']:.2f}", rows["bright-field fit"])
        self.check_instrument_metadata()

    def check_instrument_metadata(self):
        """The panel's instrument fields (GET /api/browse/metadata), each
        value against the synth files read with h5py, and how it is shown."""
        import h5py
        shown = self.wait_for("""(() => {
            const values = [...document.querySelectorAll('#metadata-instrument dd')];
            if (!values.length) return null;
            return Object.fromEntries(values.map(d => [d.dataset.field,
              {text: d.textContent, value: d.dataset.value, unit: d.dataset.unit,
               label: d.previousElementSibling.textContent, title: d.title}]));
        })()""", "the instrument metadata")
        folder = os.path.join(self.data, base.SESSION)
        with h5py.File(os.path.join(folder, base.MASTER), "r") as master, \
                h5py.File(os.path.join(folder, "demo.h5"), "r") as sidecar:
            stem = sidecar["STEM Metadata"].attrs
            detector = master["entry/instrument/detector"]
            expected = {
                "high_tension": (float(stem["High Tension"][0]), "high tension", "200 kV"),
                "camera_length": (float(stem["Camera Length"][0]), "camera length", "245 mm"),
                "dwell_time": (float(stem["ScanDwellTime"][0]), "dwell time", "100 µs"),
                "count_time": (float(detector["count_time"][()]), "count time", "99.5 µs"),
                "frame_time": (float(detector["frame_time"][()]), "frame time", "100 µs"),
                "sensor_thickness": (float(detector["sensor_thickness"][()]), "sensor thickness", "1.5 mm"),
                "x_pixel_size": (float(detector["x_pixel_size"][()]), "pixel size x", "100 µm"),
                "threshold_energy": (float(detector["threshold_energy"][()]), "threshold energy", "17.5 keV"),
                "detector": (detector["description"][()].decode(), "detector", "Dectris ARINA CZT"),
                "sensor_material": (detector["sensor_material"][()].decode(), "sensor material", "CZT"),
            }
            self.assertNotIn("detector_distance", detector)  # synth writes none: the panel leaves it out
        self.assertEqual((expected["high_tension"][0], expected["camera_length"][0]), (HIGH_TENSION_V, CAMERA_LENGTH_M))
        for name, (value, label, text) in expected.items():
            self.assertIn(name, shown)
            got = shown[name]
            self.assertEqual(float(got["value"]) if isinstance(value, float) else got["value"], value, name)
            self.assertEqual((got["label"], got["text"]), (label, text), name)
        self.assertNotIn("detector_distance", shown)
        self.assertNotIn("wavelength", shown)
        self.assertIn("demo.h5:/STEM Metadata@High Tension", shown["high_tension"]["title"])
        status = self.driver.execute_script("return document.getElementById('metadata-status').textContent;")
        self.assertIn(f"From {base.MASTER} and demo.h5", status)
        # Every attribute, listed under its own summary; opened for the screenshot.
        entries = self.driver.execute_script("""
            document.getElementById('metadata-entries-panel').open = true;
            return [...document.querySelectorAll('#metadata-entries tr')].map(r => [...r.cells].map(c => c.textContent));""")
        self.assertIn(["demo_master.h5:/entry/instrument/detector/count_time", "0.0000995 s"], entries)
        self.assertIn(["demo.h5:/STEM Metadata@Camera Length", "0.245"], entries)
        summary = self.driver.execute_script("return document.getElementById('metadata-entries-summary').textContent;")
        self.assertEqual(summary, f"Every attribute ({len(entries)})")
        requests = self.driver.execute_script(
            "return window.quantemViewer.state.requests.filter(r => r.path === '/api/browse/metadata').length;")
        self.assertEqual(requests, 1)  # read once per opening of the acquisition
        self.screenshot("controls-11-metadata")
        self.driver.execute_script("document.getElementById('metadata-entries-panel').scrollIntoView();")
        self.screenshot("controls-12-metadata-attributes")


class ViewerReconnects(base.BrowserCase):
    """The daemon stops and comes back on the same port."""

    def test_1_banner_clears_and_polls_back_off(self):
        self.open_page()
        self.open_acquisition()
        port = self.daemon.port
        self.daemon.stop()
        stopped = self.driver.execute_script("return performance.now();")
        self.wait_for("(() => { const b = document.getElementById('banner');"
                      " return !b.hidden && b.dataset.kind === 'connection'; })()", "the connection banner", timeout=15)
        time.sleep(6)
        failed = self.driver.execute_script(
            "return window.quantemViewer.state.requests.filter(r => !r.status && r.at > arguments[0])"
            ".map(r => [r.path, r.at]);", stopped)
        delays = self.driver.execute_script("return window.quantemViewer.connection.delays;")
        self.screenshot("reconnect-01-daemon-away")
        # One probe at a time, each wait twice the last, and the polls paused:
        # besides the probes, only the requests that found the daemon gone failed.
        self.assertGreaterEqual(len(delays), 3, delays)
        self.assertEqual(delays[:4], [500, 1000, 2000, 4000][:len(delays[:4])])
        probes = [at for path, at in failed if path == "/api/health/live"]
        self.assertLessEqual(len(failed) - len(probes), 2, failed)
        self.assertGreaterEqual(len(probes), 2, failed)
        # A probe goes out no sooner than its wait after the one before (a loaded machine only delays it).
        for (before, after), delay in zip(zip(probes, probes[1:]), delays[1:]):
            self.assertGreaterEqual(after - before, 0.9 * delay, (probes, delays))
        self.daemon = base.Daemon(self.data, self.work, port=port)
        type(self).daemon = self.daemon
        self.wait_for("document.getElementById('banner').hidden", "the banner to clear", timeout=20)
        self.wait_for("document.querySelector('.acquisition')", "the list again")
        self.screenshot("reconnect-02-daemon-back")


if __name__ == "__main__":
    sys.exit(base.run_main(sys.modules[__name__]))
