#!/usr/bin/env python3
"""scripts/benchmarks_page.py: the page generated from a fixture's results
puts each row in its area's table for its card, --check fails with a diff on
a stale page (and on a page over the line limit), and --merge takes a suite
report of scripts/device/run.sh into the results of its card.

Usage: benchmarks_page_test.py SOURCE_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../.."))
SCRIPT = os.path.join(SOURCE, "scripts", "benchmarks_page.py")
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def tables(page):
    """{(section heading, card): [row lines]} of a generated page."""
    found, section, card = {}, None, None
    for line in page.splitlines():
        if line.startswith("## "):
            section, card = line[3:], None
        header = re.match(r"^\| (.+): what \|", line)
        if header:
            card = header.group(1)
            found[(section, card)] = []
        elif card and line.startswith("| ") and not line.startswith("|---"):
            found[(section, card)].append(line)
        elif not line.startswith("|"):
            card = None
    return found


class BenchmarksPage(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="benchmarks-page-")
        shutil.copytree(os.path.join(FIXTURES, "benchmarks"), os.path.join(self.root, "docs", "benchmarks"))
        self.page = os.path.join(self.root, "docs", "benchmarks.md")

    def tearDown(self):
        shutil.rmtree(self.root)

    def run_script(self, *arguments):
        return subprocess.run([sys.executable, SCRIPT, "--root", self.root, *arguments],
                              capture_output=True, text=True, timeout=60)

    def results(self, name):
        with open(os.path.join(self.root, "docs", "benchmarks", "results", name), encoding="utf-8") as f:
            return json.load(f)

    def generate(self):
        done = self.run_script()
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(self.page, encoding="utf-8") as f:
            return f.read()

    def test_each_row_lands_in_its_area_and_card_table(self):
        found = tables(self.generate())
        self.assertEqual(set(found), {("Load", "H100"), ("Products through HTTP", "H100"),
                                      ("Products through HTTP", "H200"), ("Export", "2-core")})
        self.assertEqual(len(found[("Products through HTTP", "H100")]), 2)
        h100 = found[("Products through HTTP", "H100")]
        self.assertEqual(h100[0], "| BF | ≤ 0.8 ms | **0.956 ms** (not met; p90 1.087, min 0.876) | H100 | 4444fb2 | "
                                  "2026-12-05 | `scripts/device/run.sh build bench-http` |")
        self.assertEqual(h100[1], "| HAADF | ≤ 0.9 ms (as ADF) | not measured | H100 | — | — | — |")
        self.assertIn("| BF | ≤ 1.0 ms | **0.884 ms** ✓ (min 0.757) | H200 |", found[("Products through HTTP", "H200")][0])
        self.assertIn("**1.83–1.93 s** (not met) | 2-core | 3e06710", found[("Export", "2-core")][0])

    def test_check_passes_on_the_generated_page_and_fails_with_a_diff_on_a_stale_one(self):
        self.generate()
        self.assertEqual(self.run_script("--check").returncode, 0)
        path = os.path.join(self.root, "docs", "benchmarks", "results", "bench-http-h200.json")
        document = self.results("bench-http-h200.json")
        document["rows"][0]["figure"] = 0.777
        with open(path, "w", encoding="utf-8") as f:
            json.dump(document, f)
        stale = self.run_script("--check")
        self.assertEqual(stale.returncode, 1)
        self.assertIn("-| BF | ≤ 1.0 ms | **0.884 ms**", stale.stdout)
        self.assertIn("+| BF | ≤ 1.0 ms | **0.777 ms**", stale.stdout)
        os.remove(self.page)
        self.assertEqual(self.run_script("--check").returncode, 1)

    def test_check_fails_on_a_page_over_400_lines(self):
        template = os.path.join(self.root, "docs", "benchmarks", "template.md")
        with open(template, "a", encoding="utf-8") as f:
            f.write("text\n" * 400)
        self.generate()
        over = self.run_script("--check")
        self.assertEqual(over.returncode, 1)
        self.assertIn("over 400", over.stderr)

    def test_an_area_without_its_marker_is_refused(self):
        template = os.path.join(self.root, "docs", "benchmarks", "template.md")
        with open(template, encoding="utf-8") as f:
            text = f.read()
        with open(template, "w", encoding="utf-8") as f:
            f.write(text.replace("<!-- rows: export -->", ""))
        refused = self.run_script()
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("export", refused.stderr)

    def test_merge_takes_a_suite_report_into_its_cards_results(self):
        done = self.run_script("--merge", os.path.join(FIXTURES, "bench-http-suite-report.json"))
        self.assertEqual(done.returncode, 0, done.stderr)
        rows = {row["id"]: row for row in self.results("bench-http-h100.json")["rows"]}
        self.assertEqual(rows["bf"]["figure"], 0.712)
        self.assertEqual((rows["bf"]["commit"], rows["bf"]["date"], rows["bf"]["goal"]),
                         ("0123456", "2026-12-07", "≤ 0.8"))
        self.assertEqual(rows["bf"]["detail"], "p90 0.800, min 0.650; daemon 0.41")
        self.assertEqual(rows["abf"]["detail"], "p90 1.000, min 0.850")  # no daemon stages in the row
        self.assertEqual(rows["cold-start"]["figure"], "0.339–0.351")
        self.assertEqual(rows["loopback-1mib"]["figure"], 0.178)
        self.assertIsNone(rows["haadf"]["figure"])  # no HAADF row in the report: left as it was
        self.assertNotIn("wrk", rows)  # its step failed
        self.assertEqual(self.results("bench-http-h200.json")["rows"][0]["figure"], 0.884)  # another card
        with open(self.page, encoding="utf-8") as f:
            page = f.read()
        self.assertIn("| BF | ≤ 0.8 ms | **0.712 ms** ✓ (p90 0.800, min 0.650; daemon 0.41) | H100 | 0123456 | "
                      "2026-12-07 |", page)
        self.assertEqual(self.run_script("--check").returncode, 0)

    def test_a_new_card_gets_its_own_file_with_the_suites_goals(self):
        with open(os.path.join(FIXTURES, "bench-http-suite-report.json"), encoding="utf-8") as f:
            report = json.load(f)
        report["gpu"] = "NVIDIA H200, 580.159.04, 143771 MiB"
        path = os.path.join(self.root, "report.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(report, f)
        report["gpu"] = "NVIDIA B200, 580.159.04, 183359 MiB"
        path_b200 = os.path.join(self.root, "report-b200.json")
        with open(path_b200, "w", encoding="utf-8") as f:
            json.dump(report, f)
        self.assertEqual(self.run_script("--merge", path, path_b200).returncode, 0)
        b200 = {row["id"]: row for row in self.results("bench-http-b200.json")["rows"]}
        self.assertEqual(b200["bf"]["figure"], 0.712)
        self.assertIn(b200["bf"]["goal"], ("≤ 0.8", "≤ 1.0"))
        self.assertEqual(self.results("bench-http-h200.json")["rows"][0]["figure"], 0.712)


class RepositoryPage(unittest.TestCase):
    def test_every_area_a_suite_fills_has_its_place_in_the_template(self):
        sys.path.insert(0, os.path.join(SOURCE, "scripts"))
        import benchmark_rows
        with open(os.path.join(SOURCE, "docs", "benchmarks", "template.md"), encoding="utf-8") as f:
            markers = set(re.findall(r"^<!-- rows: ([a-z0-9-]+) -->$", f.read(), re.M))
        for suite, specs in benchmark_rows.SUITES.items():
            for spec in specs():
                self.assertIn(spec[1], markers, f"{suite} row {spec[0]}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
