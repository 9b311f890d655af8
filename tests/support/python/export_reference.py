#!/usr/bin/python3
"""Independent check of a `quantem-gpu export` against its source, with h5py +
hdf5plugin (the official bitshuffle filter) + numpy only.

Usage: export_reference.py SOURCE_MASTER EXPORT_MASTER [--crop R0,R1,C0,C1]
                           [--scan-bin N] [--det-bin N] [--frames-per-file N]

The plan's frames are computed with numpy from the source as h5py reads it
(pixel_mask != 0 zeroed, as the daemon's resident holds them): the half-open
crop, then sums over scan_bin x scan_bin positions and det_bin x det_bin
pixels, partial edge bins kept. Prints one JSON object of facts and checks.
"""
import argparse
import json
import os
import sys

import h5py
import hdf5plugin  # noqa: F401  (registers the bitshuffle filter with h5py)
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from products_load_fixture import read_counts  # noqa: E402


def bin_axis(array, axis, size):
    """Sums groups of `size` along `axis`; the last group may be partial."""
    length = array.shape[axis]
    starts = np.arange(0, length, size)
    return np.add.reduceat(array, starts, axis=axis)


def plan_frames(counts, crop, scan_bin, det_bin):
    r0, r1, c0, c1 = crop
    region = counts[r0:r1, c0:c1]
    binned = bin_axis(bin_axis(region, 0, scan_bin), 1, scan_bin)
    binned = bin_axis(bin_axis(binned, 2, det_bin), 3, det_bin)
    return binned


def source_mask(master_path):
    with h5py.File(master_path, "r") as master:
        spec = master.get("entry/instrument/detector/detectorSpecific")
        if spec is not None and "pixel_mask" in spec:
            return spec["pixel_mask"][...] != 0
    return None


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("source")
    p.add_argument("export")
    p.add_argument("--crop", default="")
    p.add_argument("--scan-bin", type=int, default=1)
    p.add_argument("--det-bin", type=int, default=1)
    p.add_argument("--frames-per-file", type=int, default=100000)
    args = p.parse_args()

    counts = read_counts(args.source)
    rows, cols, det_rows, det_cols = counts.shape
    crop = [int(v) for v in args.crop.split(",")] if args.crop else [0, rows, 0, cols]
    expected = plan_frames(counts, crop, args.scan_bin, args.det_bin)
    binned = args.scan_bin > 1 or args.det_bin > 1
    with h5py.File(args.source, "r") as source:
        source_dtype = np.dtype(source["entry/data/data_000001"].dtype)
    expected_dtype = np.dtype("<u4") if binned else source_dtype

    out = {"checks": {}}
    checks = out["checks"]
    with h5py.File(args.export, "r") as master:
        data = master["entry/data"]
        names = sorted(name for name in data if name.startswith("data_"))
        out["links"] = names
        files = []
        frames = []
        first = 1
        layout_ok = True
        for name in names:
            link = data.get(name, getlink=True)
            dataset = data[name]
            plist = dataset.id.get_create_plist()
            filter_id, _flags, cd_values, _name = plist.get_filter(0)
            count = dataset.shape[0]
            info = {
                "file": link.filename,
                "shape": list(dataset.shape),
                "chunks": list(dataset.chunks),
                "dtype": dataset.dtype.str,
                "filter_id": int(filter_id),
                "cd_values": [int(v) for v in cd_values],
                "image_nr_low": int(dataset.attrs["image_nr_low"]),
                "image_nr_high": int(dataset.attrs["image_nr_high"]),
            }
            files.append(info)
            layout_ok &= (info["chunks"] == [1, expected.shape[2], expected.shape[3]] and filter_id == 32008
                          and cd_values[2] == expected_dtype.itemsize and cd_values[4] == 2
                          and info["image_nr_low"] == first and info["image_nr_high"] == first + count - 1
                          and dataset.dtype == expected_dtype and os.path.dirname(link.filename) == "")
            first += count
            frames.append(dataset[...])
        out["files"] = files
        got = np.concatenate(frames, axis=0) if frames else np.zeros((0,), expected_dtype)
        spec = master["entry/instrument/detector/detectorSpecific"]
        record = master["entry/quantem_export"]
        export_mask = spec["pixel_mask"][...]
        masked_source = spec["masked_source_pixels"][...]
        out["ntrigger"] = int(spec["ntrigger"][()])
        out["nimages"] = int(spec["nimages"][()])
        out["x_pixels_in_detector"] = int(spec["x_pixels_in_detector"][()])
        out["y_pixels_in_detector"] = int(spec["y_pixels_in_detector"][()])
        out["scan_shape"] = [int(v) for v in master.attrs["scan_shape"]]
        out["record"] = {key: (text(value) if isinstance(value, (bytes, str)) else
                               [int(v) for v in np.atleast_1d(value)]) for key, value in record.attrs.items()}
        out["frames_per_file"] = [f["shape"][0] for f in files]

    checks["layout"] = bool(layout_ok)
    want_per_file = []
    total = expected.shape[0] * expected.shape[1]
    while total > 0:
        want_per_file.append(min(args.frames_per_file, total))
        total -= want_per_file[-1]
    checks["frames_per_file"] = out["frames_per_file"] == want_per_file
    checks["dtype"] = got.dtype == expected_dtype
    flat_expected = expected.reshape((-1, expected.shape[2], expected.shape[3]))
    checks["shape"] = list(got.shape) == list(flat_expected.shape)
    checks["values"] = bool(checks["shape"] and np.array_equal(got.astype(np.uint64), flat_expected))
    checks["detector_fields"] = (out["ntrigger"] == flat_expected.shape[0] and out["nimages"] == 1
                                 and out["x_pixels_in_detector"] == expected.shape[3]
                                 and out["y_pixels_in_detector"] == expected.shape[2]
                                 and out["scan_shape"] == [expected.shape[0], expected.shape[1]])
    mask = source_mask(args.source)
    if mask is None:
        mask = np.zeros((det_rows, det_cols), dtype=bool)
    masked_count = bin_axis(bin_axis(mask.astype(np.uint32), 0, args.det_bin), 1, args.det_bin)
    covered = bin_axis(bin_axis(np.ones_like(mask, dtype=np.uint32), 0, args.det_bin), 1, args.det_bin)
    checks["pixel_mask"] = bool(np.array_equal(export_mask != 0, masked_count == covered)
                                and np.array_equal(masked_source, masked_count))
    record = out["record"]
    checks["plan_record"] = (record.get("scan_crop") == crop and record.get("scan_bin") == [args.scan_bin]
                             and record.get("detector_bin") == [args.det_bin]
                             and record.get("source_master") == os.path.abspath(args.source)
                             and record.get("dtype") == {1: "uint8", 2: "uint16", 4: "uint32"}[expected_dtype.itemsize]
                             and len(record.get("implementation_revision", "")) > 0)
    if not checks["values"] and checks["shape"]:
        diff = np.argwhere(got.astype(np.uint64) != flat_expected)
        out["first_difference"] = [int(v) for v in diff[0]]
    out["max_value"] = int(flat_expected.max()) if flat_expected.size else 0
    checks["all"] = all(checks.values())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
