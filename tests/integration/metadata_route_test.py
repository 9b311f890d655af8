#!/usr/bin/env python3
"""GET /api/browse/metadata of the real daemon (`serve --backend cpu`) on real
DECTRIS ARINA masters (shared/data/real/arina, copied byte for byte into a
temporary data folder), every expected value read independently with h5py:

  - the well-known fields of rsciio_test_00 (master + data + STEM Metadata
    sidecar) in their units, with their sources; the ones the files leave
    unset (detector_distance 0 m, ScanDwellTime 0 s) or lack (wavelength) absent;
  - every scalar attribute and dataset of the master and the sidecar, exactly
    the set h5py finds (external links not followed), with each dataset's units;
  - a master whose data file is missing (rsciio_MEA_ptycho_15) still answers;
  - 404 for an unknown master or session, 422 for a master that is not HDF5
    and for a query without `file`, 304 on If-None-Match.

  metadata_route_test.py QUANTEM_BINARY REAL_DATA_DIR

Exit 77 (ctest: skipped) when REAL_DATA_DIR is empty or lacks the files.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

SKIP = 77
BINARY = None
REAL = None
SESSION = "arina/real"


def h5_scalar(value):
    """An h5py value of one element as the route writes it: int, float or str."""
    import numpy
    array = numpy.asarray(value)
    if array.size != 1:
        return None
    item = array.reshape(-1)[0]
    if isinstance(item, bytes):
        return item.decode("utf-8", "replace")
    if isinstance(item, str):
        return item
    if array.dtype.kind in "iu":
        return int(item)
    if array.dtype.kind == "f":
        return float(item)
    return None


def expected_entries(path):
    """{object path or path@attribute: (value, unit)} as h5py reads the file."""
    import h5py
    entries = {}

    def attributes(name, obj, is_dataset):
        for key in obj.attrs:
            if is_dataset and key == "units":
                continue
            value = h5_scalar(obj.attrs[key])
            if value is not None:
                entries[f"{name}@{key}"] = (value, None)

    with h5py.File(path, "r") as f:
        attributes("/", f, False)

        def visit(name, obj):
            full = "/" + name
            if isinstance(obj, h5py.Dataset):
                value = h5_scalar(obj[()]) if obj.size == 1 else None
                if value is not None:
                    unit = obj.attrs.get("units")
                    entries[full] = (value, unit.decode() if isinstance(unit, bytes) else unit)
                attributes(full, obj, True)
            else:
                attributes(full, obj, False)
        f.visititems(visit)  # H5Ovisit: hard links only, as the route walks
    return entries


class Daemon:
    def __init__(self, data, work):
        self.port_file = os.path.join(work, "port")
        self.log = open(os.path.join(work, "daemon.log"), "wb")
        environment = dict(os.environ, QUANTEM_GPU_RUNTIME_DIR=os.path.join(work, "runtime"),
                           XDG_CACHE_HOME=os.path.join(work, "cache"))
        os.makedirs(environment["QUANTEM_GPU_RUNTIME_DIR"], mode=0o700)
        self.process = subprocess.Popen([BINARY, "serve", data, "--backend", "cpu", "--port", "0", "--port-file",
                                         self.port_file, "--device-budget", "256MiB"],
                                        stdout=self.log, stderr=subprocess.STDOUT, env=environment)
        deadline = time.time() + 60
        while True:
            port = ""
            if os.path.exists(self.port_file):
                with open(self.port_file) as port_file:
                    port = port_file.read().strip()
            if port:
                self.url = f"http://127.0.0.1:{int(port)}"
                try:
                    with urllib.request.urlopen(self.url + "/api/health/ready", timeout=5) as response:
                        if response.status == 200:
                            return
                except OSError:
                    pass
            if self.process.poll() is not None or time.time() > deadline:
                raise RuntimeError("the daemon did not become ready")
            time.sleep(0.1)

    def get(self, target, headers=None):
        request = urllib.request.Request(self.url + target, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class MetadataRoute(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="quantem-metadata-test-")
        cls.folder = os.path.join(cls.work, "data", SESSION)
        os.makedirs(cls.folder)
        for source in ("rsciio_test_00", "rsciio_MEA_ptycho_15"):
            for name in os.listdir(os.path.join(REAL, "arina", source)):
                shutil.copyfile(os.path.join(REAL, "arina", source, name), os.path.join(cls.folder, name))
        with open(os.path.join(cls.folder, "broken_master.h5"), "wb") as broken:
            broken.write(b"not an HDF5 file at all" * 100)
        cls.daemon = Daemon(os.path.join(cls.work, "data"), cls.work)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        shutil.rmtree(cls.work, ignore_errors=True)

    def metadata(self, file, session=SESSION):
        query = urllib.parse.urlencode({"session": session, "file": file})
        status, headers, body = self.daemon.get(f"/api/browse/metadata?{query}")
        return status, {k.lower(): v for k, v in headers.items()}, json.loads(body) if body else None

    def test_fields_of_a_real_arina_master_and_its_sidecar(self):
        import h5py
        status, _, doc = self.metadata("test_00_master.h5")
        self.assertEqual(status, 200, doc)
        master = h5py.File(os.path.join(self.folder, "test_00_master.h5"), "r")
        sidecar = h5py.File(os.path.join(self.folder, "test_00.h5"), "r")
        stem = sidecar["STEM Metadata"].attrs
        detector = master["entry/instrument/detector"]
        specific = detector["detectorSpecific"]
        text = lambda dataset: dataset[()].decode()  # noqa: E731
        expected = {
            "high_tension": (float(stem["High Tension"][0]), "V", "test_00.h5:/STEM Metadata@High Tension"),
            "camera_length": (float(stem["Camera Length"][0]), "m", "test_00.h5:/STEM Metadata@Camera Length"),
            "count_time": (float(detector["count_time"][()]), "s", None),
            "frame_time": (float(detector["frame_time"][()]), "s", None),
            "magnification": (float(stem["Magnification"][0]), None, None),
            "detector": (text(detector["description"]), None, None),
            "detector_number": (text(detector["detector_number"]), None, None),
            "sensor_material": (text(detector["sensor_material"]), None, None),
            "sensor_thickness": (float(detector["sensor_thickness"][()]), "m", None),
            "x_pixel_size": (float(detector["x_pixel_size"][()]), "m", None),
            "y_pixel_size": (float(detector["y_pixel_size"][()]), "m", None),
            "threshold_energy": (float(detector["threshold_energy"][()]), "eV", None),
            "bit_depth_image": (int(detector["bit_depth_image"][()]), None, None),
            "saturation_value": (int(detector["saturation_value"][()]), None, None),
            "trigger_mode": (text(specific["trigger_mode"]), None, None),
            "firmware_version": (text(specific["eiger_fw_version"]), None, None),
            "software_version": (text(specific["software_version"]), None, None),
            "collection_date": (text(specific["data_collection_date"]), None, None),
        }
        # What the README says of this file, so that the reading above is the one meant.
        self.assertEqual(expected["high_tension"][0], 300000.0)
        self.assertEqual(expected["detector"][0], "Dectris ARINA CZT")
        self.assertEqual(detector["count_time"].attrs["units"], b"s")
        self.assertEqual(sorted(doc["fields"]), sorted(expected))
        for name, (value, unit, source) in expected.items():
            field = doc["fields"][name]
            self.assertEqual(field["value"], value, name)
            self.assertIs(type(field["value"]), type(value), name)
            self.assertEqual(field.get("unit"), unit, name)
            if source:
                self.assertEqual(field["source"], source)
        self.assertEqual(doc["fields"]["count_time"]["source"], "test_00_master.h5:/entry/instrument/detector/count_time")
        # Left unset by the files: not fields.
        self.assertEqual(float(detector["detector_distance"][()]), 0.0)
        self.assertEqual(float(stem["ScanDwellTime"][0]), 0.0)
        self.assertNotIn("entry/instrument/beam/incident_wavelength", master)
        self.assertEqual(doc["sidecar"], "test_00.h5")
        self.assertEqual(doc["file"], "test_00_master.h5")
        self.assertEqual(doc["path"], os.path.join(self.folder, "test_00_master.h5"))

    def test_every_scalar_attribute_and_dataset(self):
        _, _, doc = self.metadata("test_00_master.h5")
        self.assertFalse(doc["entries_truncated"])
        for file in ("test_00_master.h5", "test_00.h5"):
            expected = expected_entries(os.path.join(self.folder, file))
            served = {e["path"]: (e["value"], e.get("unit")) for e in doc["entries"] if e["file"] == file}
            self.assertEqual(served, expected, file)
        paths = {e["path"] for e in doc["entries"]}
        self.assertIn("/entry/instrument/detector/detectorSpecific/ntrigger", paths)
        self.assertIn("/STEM Metadata@High Tension", paths)
        self.assertFalse(any(p.startswith("/entry/data/data_") for p in paths), "an external link was followed")

    def test_a_master_without_its_data_file_still_answers(self):
        import h5py
        status, _, doc = self.metadata("MEA_ptycho_15_master.h5")
        self.assertEqual(status, 200, doc)
        with h5py.File(os.path.join(self.folder, "MEA_ptycho_15_master.h5"), "r") as master:
            count_time = float(master["entry/instrument/detector/count_time"][()])
        self.assertEqual(doc["fields"]["count_time"]["value"], count_time)
        self.assertAlmostEqual(count_time, 499.5e-6, delta=1e-9)
        self.assertEqual(doc["sidecar"], "MEA_ptycho_15.h5")

    def test_errors_and_revalidation(self):
        status, _, doc = self.metadata("missing_master.h5")
        self.assertEqual(status, 404, doc)
        status, _, doc = self.metadata("test_00_master.h5", session="no/such/session")
        self.assertEqual(status, 404, doc)
        status, _, doc = self.metadata("broken_master.h5")
        self.assertEqual(status, 422, doc)
        self.assertIn("not readable HDF5", doc["detail"])
        status, _, body = self.daemon.get(f"/api/browse/metadata?session={SESSION}")
        self.assertEqual(status, 422, body)
        status, headers, _ = self.metadata("test_00_master.h5")
        self.assertEqual(status, 200)
        query = urllib.parse.urlencode({"session": SESSION, "file": "test_00_master.h5"})
        status, _, body = self.daemon.get(f"/api/browse/metadata?{query}", {"If-None-Match": headers["etag"]})
        self.assertEqual((status, body), (304, b""))
        # The daemon still serves after the broken master.
        self.assertEqual(self.metadata("MEA_ptycho_15_master.h5")[0], 200)


def main():
    global BINARY, REAL
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    BINARY, REAL = sys.argv[1], sys.argv[2]
    if not REAL or not os.path.isdir(os.path.join(REAL, "arina", "rsciio_test_00")):
        print("real detector files (shared/data/real) not found: skipped")
        return SKIP
    try:
        import h5py  # noqa: F401
    except ImportError:
        print("h5py missing: skipped")
        return SKIP
    result = unittest.main(argv=[sys.argv[0], "-v"], exit=False).result
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
