#!/usr/bin/env python3
"""The viewer with a catalog of thousands, in headless Chromium against the real
daemon (`serve --backend cpu`): 3,000 small acquisitions (one `synth`
acquisition copied into 30 session folders of 100 masters) and one 40x48
`synth` acquisition listed last.

  viewer_catalog_test.py --binary build/src/cli/quantem-gpu --artifacts DIR

Checks: the list is virtualised (only the rows in view exist, the rest are
reached by scrolling or the filter); a click on the last acquisition draws its
BF; residency badges survive list rebuilds and follow a crop's load; unchanged
catalog polls are 304s; the top bar names the data folder; the filter by name,
dtype, shape and residency. Screenshots go to DIR. Skips (77) without
Chromium as viewer_browser_test.py does.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import viewer_browser_test as base  # noqa: E402  (the daemon and browser helpers)

SESSIONS = 30
PER_SESSION = 100
DEMO_SESSION = "zz/20261202_last"
DEMO = "demo_master.h5"


def make_catalog(binary, data):
    """3,000 masters: one synth acquisition, its master copied under 100 names
    in each of 30 folders (all linking the folder's one data file)."""
    template = os.path.join(data, "..", "template")
    subprocess.run([binary, "synth", template, "--prefix", "acq", "--scan", "4x4", "--detector", "8x8",
                    "--threads", "1"], check=True, stdout=subprocess.DEVNULL)
    for s in range(SESSIONS):
        folder = os.path.join(data, "beamtime", f"s{s:02d}")
        os.makedirs(folder)
        shutil.copyfile(os.path.join(template, "acq_data_000001.h5"), os.path.join(folder, "acq_data_000001.h5"))
        for i in range(PER_SESSION):
            shutil.copyfile(os.path.join(template, "acq_master.h5"), os.path.join(folder, f"acq{i:03d}_master.h5"))
    subprocess.run([binary, "synth", os.path.join(data, DEMO_SESSION), "--prefix", "demo", "--scan", "40x48",
                    "--detector", "64x64", "--dtype", "uint32", "--threads", "1"],
                   check=True, stdout=subprocess.DEVNULL)


class CatalogOfThousands(base.BrowserCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="quantem-viewer-catalog-")
        cls.data = os.path.join(cls.work, "data")
        make_catalog(base.ARGS.binary, cls.data)
        cls.daemon = base.Daemon(cls.data, cls.work)
        cls.driver = base.start_browser(os.path.join(cls.work, "profile"))
        cls.driver.set_script_timeout(60)
        cls.driver.get(cls.daemon.url)

    def count_rows(self):
        return self.driver.execute_script("return document.querySelectorAll('#acquisition-list .acquisition').length;")

    def filter_to(self, text, resident=False):
        self.driver.execute_script("""
            const search = document.getElementById('catalog-search');
            search.value = arguments[0];
            search.dispatchEvent(new Event('input'));
            const resident = document.getElementById('catalog-resident');
            if (resident.checked !== arguments[1]) { resident.checked = arguments[1]; resident.dispatchEvent(new Event('change')); }""",
                                   text, resident)

    def badge(self, session, file):
        return self.driver.execute_script("""
            const item = document.querySelector(`.acquisition[data-session='${arguments[0]}'][data-file='${arguments[1]}']`);
            return item ? item.querySelector('.residency-badge').textContent : null;""", session, file)

    def test_1_the_list_is_virtualised_and_reaches_its_last_row(self):
        count = self.wait_for("document.getElementById('catalog-count').textContent", "the catalog count")
        self.assertEqual(count, str(SESSIONS * PER_SESSION + 1))
        self.wait_for("document.querySelectorAll('#acquisition-list .acquisition').length > 0", "the first rows")
        # Only the rows in view (and a few beyond) exist: not 3,001 buttons.
        self.assertLess(self.count_rows(), 60)
        # The list keeps its full height: scrolling to the end shows the last acquisition.
        self.driver.execute_script("const l = document.getElementById('acquisition-list'); l.scrollTop = l.scrollHeight;")
        self.wait_for(f"document.querySelector(`.acquisition[data-file='{DEMO}']`)", "the last row after scrolling")
        self.assertLess(self.count_rows(), 60)
        self.screenshot("catalog-01-scrolled-to-the-end")

    def test_2_click_on_the_last_acquisition_draws_its_bright_field(self):
        self.driver.execute_script("const l = document.getElementById('acquisition-list'); l.scrollTop = l.scrollHeight;")
        self.wait_for(f"document.querySelector(`.acquisition[data-file='{DEMO}']`)", "the demo row")
        self.driver.execute_script(f"document.querySelector(`.acquisition[data-file='{DEMO}']`).click();")
        self.wait_for("(() => { const r = window.quantemViewer.state.realspace;"
                      " return r && r.params.file === 'demo_master.h5' && r.image.width === 48; })()",
                      "the demo acquisition's BF")
        self.assertGreater(self.canvas_variance("realspace-canvas"), 0)
        self.wait_for(f"document.querySelector(`.acquisition[data-file='{DEMO}']`).classList.contains('selected')",
                      "the selected row")
        self.screenshot("catalog-02-last-acquisition-open")

    def test_3_residency_badges_survive_a_rebuild_and_follow_a_crop(self):
        # test_2 opened the demo (resident); a rebuild (Refresh) keeps its badge.
        self.wait_for(f"(document.querySelector(`.acquisition[data-file='{DEMO}'] .residency-badge`) || {{}})"
                      ".textContent?.startsWith('resident')", "the demo's resident badge")
        builds = self.driver.execute_script("return window.quantemViewer.state.catalog.builds;")
        renders = self.driver.execute_script("return Number(document.getElementById('acquisition-list').dataset.renders);")
        self.driver.execute_script("document.getElementById('refresh-button').click();")
        self.wait_for(f"Number(document.getElementById('acquisition-list').dataset.renders) > {renders}"
                      f" || window.quantemViewer.state.catalog.builds > {builds}"
                      " || window.quantemViewer.state.requests.some(r => r.query.includes('refresh=true') && r.status)",
                      "the refresh's answer")
        time.sleep(0.3)
        self.assertTrue(self.badge(DEMO_SESSION, DEMO).startswith("resident"), self.badge(DEMO_SESSION, DEMO))
        # Evicted, then a crop is asked for: the daemon loads it again, and the
        # badges (row and header) follow the load instead of staying "on disk".
        self.driver.execute_script("document.getElementById('evict-button').click();")
        self.wait_for("document.getElementById('residency-state').textContent === 'on disk'", "the eviction")
        self.driver.execute_script("""
            document.getElementById('crop-row-start').value = 8;
            document.getElementById('crop-row-stop').value = 24;
            document.getElementById('plan-form').requestSubmit();""")
        self.wait_for("(() => { const r = window.quantemViewer.state.realspace;"
                      " return r && r.params.row_start === 8 && r.image.height === 16; })()", "the crop's image")
        self.wait_for("/^(resident|loading)/.test(document.getElementById('residency-state').textContent)",
                      "the header badge to follow the crop's load", timeout=10)
        self.wait_for(f"/^(resident|loading)/.test(document.querySelector(`.acquisition[data-file='{DEMO}'] "
                      ".residency-badge`).textContent)", "the row badge to follow the crop's load", timeout=10)
        self.screenshot("catalog-03-crop-after-evict")

    def test_4_unchanged_catalog_polls_are_answered_304(self):
        # The page revalidates with If-None-Match: nothing changed, no body, nothing rebuilt.
        self.wait_for(f"document.getElementById('catalog-count').textContent === '{SESSIONS * PER_SESSION + 1}'",
                      "the whole catalog")
        self.wait_for("window.quantemViewer.state.requests.some(r => r.path === '/api/browse/acquisitions' && r.status)",
                      "the page's first poll")
        builds = self.driver.execute_script("return window.quantemViewer.state.catalog.builds;")
        first = self.driver.execute_script("return window.quantemViewer.state.requests.length;")
        self.driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            const v = window.quantemViewer;
            v.pollAcquisitions().then(() => v.pollAcquisitions()).then(() => v.pollAcquisitions()).then(done);""")
        polls = self.driver.execute_script(
            "return window.quantemViewer.state.requests.slice(arguments[0])"
            ".filter(r => r.path === '/api/browse/acquisitions').map(r => [r.status, r.bytes]);", first)
        self.assertGreaterEqual(len(polls), 3, polls)
        self.assertEqual(polls[-2:], [[304, 0], [304, 0]], polls)
        # (The page's first poll had the whole document: 3,001 masters, over 500 KB.)
        first_polls = self.driver.execute_script(
            "return window.quantemViewer.state.requests.filter(r => r.path === '/api/browse/acquisitions'"
            " && r.status === 200).map(r => r.bytes);")
        self.assertGreater(max(first_polls), 500_000, first_polls)
        # ... and the page took them as answers (nothing to parse), not as failures.
        self.assertEqual(self.driver.execute_script("return window.quantemViewer.state.catalog.lastPollStatus;"), 304)
        self.driver.execute_async_script("""
            const done = arguments[arguments.length - 1];
            window.quantemViewer.loadSessions(true).then(done);""")
        sessions = self.driver.execute_script(
            "return window.quantemViewer.state.requests.filter(r => r.path === '/api/browse/sessions').map(r => r.status);")
        self.assertEqual(sessions[-1], 304, sessions)
        self.assertEqual(self.driver.execute_script("return window.quantemViewer.state.catalog.builds;"), builds)

    def test_5_the_top_bar_names_the_data_folder(self):
        info = self.driver.execute_script("return document.getElementById('daemon-info').textContent;")
        self.assertTrue(info.endswith(self.data), info)
        self.assertFalse(info.rstrip().endswith("·"), info)

    def test_5b_keys_step_through_the_acquisitions(self):
        from selenium.webdriver.common.action_chains import ActionChains
        # The demo (last) is open: k opens the one before it, j the demo again.
        self.driver.execute_script("document.activeElement && document.activeElement.blur();")
        ActionChains(self.driver).send_keys("k").perform()
        self.wait_for("window.quantemViewer.state.current.file === 'acq099_master.h5'"
                      " && document.querySelector(`.acquisition[data-file='acq099_master.h5'][data-session='beamtime/s29']`)"
                      ".classList.contains('selected')", "the previous acquisition")
        ActionChains(self.driver).send_keys("j").perform()
        self.wait_for(f"window.quantemViewer.state.current.file === '{DEMO}'", "the demo again")
        self.wait_for("(() => { const r = window.quantemViewer.state.realspace;"
                      " return r && r.params.file === 'demo_master.h5' && r.image.width === 48; })()", "its BF")

    def test_6_filter_by_name_dtype_shape_and_residency(self):
        self.filter_to("demo")
        self.wait_for("document.querySelectorAll('#acquisition-list .acquisition').length === 1", "one match")
        self.assertIn("1 of 3001", self.driver.execute_script("return document.getElementById('filter-count').textContent;"))
        self.filter_to("dtype:uint32")
        self.wait_for(f"document.querySelector(`.acquisition[data-file='{DEMO}']`)"
                      " && document.querySelectorAll('#acquisition-list .acquisition').length === 1", "the uint32 match")
        self.filter_to("shape:4x4 acq042")
        self.wait_for("document.getElementById('filter-count')?.textContent.startsWith('30 of')", "30 masters acq042")
        self.filter_to("date:20261202")  # the session folder's date part
        self.wait_for(f"document.querySelector(`.acquisition[data-file='{DEMO}']`)"
                      " && document.querySelectorAll('#acquisition-list .acquisition').length === 1", "the dated match")
        self.filter_to("s07 acq00")
        self.wait_for("document.getElementById('filter-count')?.textContent.startsWith('10 of')", "ten in s07")
        self.screenshot("catalog-04-filtered")
        # Residency: the acquisitions resident or loading (the demo, and acq099 that `k` opened).
        self.filter_to("", resident=True)
        shown = self.wait_for("(() => { const rows = [...document.querySelectorAll('#acquisition-list .acquisition')]"
                              ".map(b => b.dataset.file).sort(); return rows.length === 2 ? rows : null; })()",
                              "the resident ones")
        self.assertEqual(shown, ["acq099_master.h5", DEMO])
        self.screenshot("catalog-05-resident-only")
        self.filter_to("")
        self.wait_for("!document.getElementById('filter-count')", "the whole list again")
        severe = [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]
        self.assertEqual(severe, [])


if __name__ == "__main__":
    sys.exit(base.run_main(sys.modules[__name__]))
