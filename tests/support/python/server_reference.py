#!/usr/bin/python3
"""Fixtures and expected responses for the `quantem-gpu serve` integration tests.

Independent of the daemon: acquisitions are written with h5py and the official
bitshuffle/LZ4 filter (hdf5plugin), read back with h5py, and every expected
payload is computed with numpy from the stored counts.

usage: server_reference.py prepare ROOT [--synth SESSION STEM ROWSxCOLS]...

Writes the acquisitions below ROOT/data (one session folder each), reads them
back (plus any synth-written acquisition named with --synth), and writes
ROOT/expected/<case>.npy for every success case and ROOT/manifest.json:
  {"cases":  [{"name", "route", "query", "kind": "exact"|"float"|"icom",
               "dtype", "width", "height", "divisor", "cache_control",
               "scan_bin", "det_bin", "masked_pixels", "source_dtype"}],
   "errors": [{"name", "method", "route", "query", "status", "detail"}]}
Rules implemented here (docs/protocol.md, "Products" and "4. Tightened rules"):
masked pixels (pixel_mask & 0xFFFF != 0) are zero in every frame; crop half-open;
scan and detector bins are uint64 block sums with partial edges kept; the
bright-field fit is float64 from the exact mean pattern (threshold mean +
population std, strict >, centre = mean index, radius sqrt(count/pi); none above:
centre (H/2, W/2), radius min(H, W)/4); detector masks compare float64 squared
distances of integer pixel centres, inclusive; CoM = float32(moment / total) in
binned coordinates; iCoM integrates the CoM field with a float64 FFT.
"""
import argparse
import json
import math
import os
import re
import urllib.parse

import h5py
import hdf5plugin
import numpy as np

UINT32_MAX = 2**32 - 1


# ---------------------------------------------------------------- fixtures

def disk_frames(rng, scan, det, dtype, low, high, background):
    """Frames with a bright disk whose centre drifts a little with the scan position."""
    rows, cols = scan
    det_rows, det_cols = det
    frames = np.zeros((rows * cols, det_rows, det_cols), dtype=np.uint64)
    rr, cc = np.ogrid[:det_rows, :det_cols]
    radius = 0.3 * min(det_rows, det_cols)
    for index in range(rows * cols):
        cy = det_rows / 2 + 0.4 * ((index % 3) - 1)
        cx = det_cols / 2 - 0.3 * ((index % 2) - 0.5)
        inside = (rr - cy) ** 2 + (cc - cx) ** 2 <= radius ** 2
        frame = rng.integers(0, background + 1, size=det).astype(np.uint64)
        frame[inside] = rng.integers(low, high + 1, size=int(inside.sum()))
        frames[index] = frame
    return frames.astype(dtype)


def write_acquisition(folder, stem, scan, det, frames, frames_per_shard, masked, scan_shape_attr=True,
                      ntrigger=None):
    os.makedirs(folder, exist_ok=True)
    total = frames.shape[0]
    shard_names = []
    for number, start in enumerate(range(0, total, frames_per_shard), start=1):
        name = "%s_data_%06d.h5" % (stem, number)
        with h5py.File(os.path.join(folder, name), "w") as f:
            f.create_dataset("entry/data/data", data=frames[start:start + frames_per_shard],
                             chunks=(1,) + tuple(det), **hdf5plugin.Bitshuffle(nelems=0, cname="lz4"))
        shard_names.append(name)
    master = os.path.join(folder, stem + "_master.h5")
    with h5py.File(master + ".part", "w") as f:
        data = f.create_group("entry/data")
        for number, name in enumerate(shard_names, start=1):
            data["data_%06d" % number] = h5py.ExternalLink(name, "/entry/data/data")
        specific = f.create_group("entry/instrument/detector/detectorSpecific")
        specific["ntrigger"] = np.int64(total if ntrigger is None else ntrigger)
        specific["nimages"] = np.int64(1)
        pixel_mask = np.zeros(det, dtype=np.uint32)
        for row, col, value in masked:
            pixel_mask[row, col] = value
        specific["pixel_mask"] = pixel_mask
        if scan_shape_attr:
            f.attrs["scan_shape"] = np.array(scan, dtype=np.int64)
    os.replace(master + ".part", master)
    return master


def write_fixtures(data_root):
    rng = np.random.default_rng(20260817)
    fixtures = {}

    # Non-square scan, odd detector, uint16 over three shards, two bad pixels
    # written as large counts (they must read as zero).
    scan, det = (5, 7), (9, 11)
    frames = disk_frames(rng, scan, det, np.uint16, 20, 60, 2)
    frames[:, 1, 2] = 5000
    frames[:, 6, 9] = 7000
    fixtures["odd16"] = dict(session="odd16", stem="odd16", scan=scan, master=write_acquisition(
        os.path.join(data_root, "odd16"), "odd16", scan, det, frames, 13, [(1, 2, 1), (6, 9, 4)]))

    # uint8, square detector of even size, one shard.
    scan, det = (4, 3), (6, 6)
    frames = disk_frames(rng, scan, det, np.uint8, 100, 255, 3)
    frames[:, 0, 5] = 255
    fixtures["small8"] = dict(session="small8", stem="small8", scan=scan, master=write_acquisition(
        os.path.join(data_root, "small8"), "small8", scan, det, frames, 100, [(0, 5, 1)]))

    # uint32 whose masked counts fit 16 bits (narrowable); the masked pixel holds 2^31.
    scan, det = (3, 4), (7, 7)
    frames = disk_frames(rng, scan, det, np.uint32, 1000, 65535, 10)
    frames[:, 3, 3] = 2**31
    fixtures["narrow32"] = dict(session="u32/narrow", stem="narrow32", scan=scan, master=write_acquisition(
        os.path.join(data_root, "u32", "narrow"), "narrow32", scan, det, frames, 5, [(3, 3, 1)]))

    # uint32 with counts far above 16 bits: must stay exact.
    scan, det = (3, 3), (5, 5)
    frames = disk_frames(rng, scan, det, np.uint32, 70000, 40000001, 66000)
    fixtures["wide32"] = dict(session="u32/wide", stem="wide32", scan=scan, master=write_acquisition(
        os.path.join(data_root, "u32", "wide"), "wide32", scan, det, frames, 100, []))

    # uint32 where a sum of two pixels passes 2^32 - 1: the overflow conflict.
    scan, det = (2, 2), (3, 3)
    frames = np.full((4,) + det, 2**31, dtype=np.uint32)
    fixtures["overflow32"] = dict(session="u32/overflow", stem="overflow32", scan=scan, master=write_acquisition(
        os.path.join(data_root, "u32", "overflow"), "overflow32", scan, det, frames, 100, []))

    # Not ready: the second shard is missing.
    scan, det = (2, 3), (4, 4)
    frames = disk_frames(rng, scan, det, np.uint16, 5, 9, 1)
    master = write_acquisition(os.path.join(data_root, "pending"), "pending", scan, det, frames, 3, [])
    os.remove(os.path.join(data_root, "pending", "pending_data_000002.h5"))
    fixtures["pending"] = dict(session="pending", stem="pending", scan=scan, master=master,
                               missing=os.path.join(os.path.abspath(data_root), "pending", "pending_data_000002.h5"))

    # Ready but no usable scan shape: 6 frames, no scan_shape, not a square.
    scan, det = (2, 3), (4, 4)
    frames = disk_frames(rng, scan, det, np.uint16, 5, 9, 1)
    fixtures["noshape"] = dict(session="noshape", stem="noshape", scan=None, master=write_acquisition(
        os.path.join(data_root, "noshape"), "noshape", scan, det, frames, 100, [], scan_shape_attr=False))
    return fixtures


# ---------------------------------------------------------------- reference

def read_counts(master, scan):
    with h5py.File(master, "r") as f:
        names = sorted(name for name in f["entry/data"] if re.fullmatch(r"data_\d{6}", name))
        frames = np.concatenate([f["entry/data"][name][...] for name in names]).astype(np.uint64)
        mask_path = "entry/instrument/detector/detectorSpecific/pixel_mask"
        pixel_mask = f[mask_path][...] if mask_path in f else np.zeros(frames.shape[1:], np.uint32)
        source_dtype = str(f["entry/data"][names[0]].dtype)
    masked = (pixel_mask.astype(np.int64) & 0xFFFF) != 0
    frames[:, masked] = 0
    return frames.reshape(scan + frames.shape[1:]), int(masked.sum()), source_dtype


def block_sum(volume, axes, size):
    for axis in axes:
        extent = volume.shape[axis]
        padded_extent = -(-extent // size) * size
        pad = [(0, 0)] * volume.ndim
        pad[axis] = (0, padded_extent - extent)
        volume = np.pad(volume, pad)
        shape = list(volume.shape)
        shape[axis:axis + 1] = [padded_extent // size, size]
        volume = volume.reshape(shape).sum(axis=axis + 1, dtype=np.uint64)
    return volume


def plan_volume(counts, params):
    volume = counts
    if "row_start" in params:
        volume = volume[int(params["row_start"]):int(params["row_stop"]),
                        int(params["column_start"]):int(params["column_stop"])]
    volume = block_sum(volume, (0, 1), int(params.get("scan_bin", 1)))
    return block_sum(volume, (2, 3), int(params.get("det_bin", 1)))


def bright_field(volume):
    rows, cols, height, width = volume.shape
    mean_pattern = volume.sum(axis=(0, 1), dtype=np.uint64).astype(np.float64) / (rows * cols)
    above = mean_pattern > mean_pattern.mean() + mean_pattern.std()
    if not above.any():
        return height / 2.0, width / 2.0, min(height, width) / 4.0
    r, c = np.nonzero(above)
    return r.mean(), c.mean(), math.sqrt(above.sum() / math.pi)


def squared_distance(height, width, cy, cx):
    r = np.arange(height, dtype=np.float64)[:, None]
    c = np.arange(width, dtype=np.float64)[None, :]
    return (r - cy) ** 2 + (c - cx) ** 2


def masked_sum(volume, mask):
    return (volume * mask[None, None].astype(np.uint64)).sum(axis=(2, 3), dtype=np.uint64)


def center_of_mass(volume):
    height, width = volume.shape[2:]
    total = volume.sum(axis=(2, 3), dtype=np.uint64)
    rows = np.arange(height, dtype=np.uint64)[None, None, :, None]
    cols = np.arange(width, dtype=np.uint64)[None, None, None, :]
    row_moment = (volume * rows).sum(axis=(2, 3), dtype=np.uint64)
    col_moment = (volume * cols).sum(axis=(2, 3), dtype=np.uint64)
    safe = np.where(total == 0, 1, total).astype(np.float64)
    com_row = np.where(total == 0, 0.0, row_moment.astype(np.float64) / safe).astype(np.float32)
    com_col = np.where(total == 0, 0.0, col_moment.astype(np.float64) / safe).astype(np.float32)
    return com_row, com_col


def integrate_com(com_row, com_col):
    rows, cols = com_row.shape
    nu_r, nu_c = np.meshgrid(np.fft.fftfreq(rows), np.fft.fftfreq(cols), indexing="ij")
    k2 = nu_r ** 2 + nu_c ** 2
    k2[0, 0] = 1.0
    phi_k = (-0.25j) * (nu_r * np.fft.fft2(com_row.astype(np.float64)) +
                        nu_c * np.fft.fft2(com_col.astype(np.float64))) / k2
    phi_k[0, 0] = 0
    phi = np.real(np.fft.ifft2(phi_k))
    return (-(phi - phi.mean())).astype(np.float32)


def realspace(volume, params):
    mode = params.get("mode", "BF")
    cy_fit, cx_fit, radius = bright_field(volume)
    cy = float(params["cy"]) if "cy" in params else cy_fit
    cx = float(params["cx"]) if "cx" in params else cx_fit
    inner_px = max(0.0, float(params.get("inner", 0.0)) * radius)
    outer_px = max(inner_px + 1.0, float(params.get("outer", 1.0)) * radius)
    height, width = volume.shape[2:]
    d2 = squared_distance(height, width, cy, cx)
    if mode == "BF":
        return masked_sum(volume, d2 <= outer_px ** 2), "exact"
    if mode in ("ABF", "ADF", "HAADF", "DF"):
        return masked_sum(volume, (d2 >= inner_px ** 2) & (d2 <= outer_px ** 2)), "exact"
    com_row, com_col = center_of_mass(volume)
    if mode == "CoMy":
        return com_row, "float"
    if mode == "CoMx":
        return com_col, "float"
    if mode in ("CoMmag", "DPC"):
        return np.hypot(com_row.astype(np.float64), com_col.astype(np.float64)).astype(np.float32), "float"
    if mode == "iCoM":
        return integrate_com(com_row, com_col), "icom"
    raise SystemExit("unknown mode " + mode)


def realspace_shape(volume, params):
    shape = params.get("shape", "annulus")
    cy, cx = float(params.get("cy", 0.0)), float(params.get("cx", 0.0))
    inner, outer = float(params.get("inner", 0.0)), float(params.get("outer", 0.0))
    height, width = volume.shape[2:]
    if shape == "square":
        r = np.arange(height, dtype=np.float64)[:, None]
        c = np.arange(width, dtype=np.float64)[None, :]
        mask = (np.abs(r - cy) <= outer) & (np.abs(c - cx) <= outer)
    else:
        d2 = squared_distance(height, width, cy, cx)
        mask = d2 <= outer ** 2
        if shape == "annulus":
            mask &= d2 >= inner ** 2
    return masked_sum(volume, mask), "exact"


def cbed(volume, params):
    rows, cols = volume.shape[:2]
    row = min(max(int(params.get("sx", 0)), 0), rows - 1)
    col = min(max(int(params.get("sy", 0)), 0), cols - 1)
    return volume[row, col], "exact"


def scan_roi(rows, cols, params):
    shape = params.get("shape", "circle")
    cy, cx, radius = float(params.get("cy", 0.0)), float(params.get("cx", 0.0)), float(params.get("radius", 1.0))
    r_lo, r_hi = max(0, math.ceil(cy - radius)), min(rows - 1, math.floor(cy + radius))
    c_lo, c_hi = max(0, math.ceil(cx - radius)), min(cols - 1, math.floor(cx + radius))
    selected = []
    for r in range(r_lo, r_hi + 1):
        for c in range(c_lo, c_hi + 1):
            if shape == "square" or (r - cy) ** 2 + (c - cx) ** 2 <= radius ** 2:
                selected.append((r, c))
    return selected


def cbed_region(volume, params):
    selected = scan_roi(volume.shape[0], volume.shape[1], params)
    frames = np.stack([volume[r, c] for r, c in selected])
    if params.get("reduce", "mean") == "max":
        return frames.max(axis=0), "exact", 1
    divisor = len(selected) if params.get("reduce", "mean") == "mean" else 1
    return frames.sum(axis=0, dtype=np.uint64), "exact", divisor


CACHE_CONTROL = {"realspace": "max-age=300", "realspace-shape": "max-age=300", "cbed": "max-age=60",
                 "cbed-region": "no-store"}

# (fixture, route, params) success cases.
CASES = [
    ("odd16", "realspace", {}),
    ("odd16", "realspace", {"mode": "ABF", "inner": "0.5", "outer": "1.5"}),
    ("odd16", "realspace", {"mode": "ADF", "inner": "1", "outer": "2.5", "cx": "4.25", "cy": "5"}),
    ("odd16", "realspace", {"mode": "HAADF", "inner": "1.2", "outer": "3"}),
    ("odd16", "realspace", {"mode": "DF", "inner": "0.8", "outer": "1.1"}),
    ("odd16", "realspace", {"mode": "CoMx"}),
    ("odd16", "realspace", {"mode": "CoMy", "det_bin": "2"}),
    ("odd16", "realspace", {"mode": "CoMmag"}),
    ("odd16", "realspace", {"mode": "DPC", "scan_bin": "2"}),
    ("odd16", "realspace", {"mode": "iCoM"}),
    ("odd16", "realspace", {"scan_bin": "2"}),
    ("odd16", "realspace", {"scan_bin": "3", "det_bin": "2"}),
    ("odd16", "realspace", {"det_bin": "4", "mode": "ADF", "inner": "0.5", "outer": "2"}),
    ("odd16", "realspace", {"row_start": "1", "row_stop": "4", "column_start": "2", "column_stop": "7"}),
    ("odd16", "realspace", {"row_start": "0", "row_stop": "5", "column_start": "1", "column_stop": "6",
                            "scan_bin": "2", "det_bin": "3"}),
    ("odd16", "realspace", {"row_start": "0", "row_stop": "5", "column_start": "0", "column_stop": "7"}),
    ("odd16", "realspace", {"scan_bin": "7"}),
    ("odd16", "realspace-shape", {"shape": "circle", "cx": "5", "cy": "4", "outer": "2.5"}),
    ("odd16", "realspace-shape", {"shape": "square", "cx": "5.5", "cy": "3.5", "outer": "2"}),
    ("odd16", "realspace-shape", {"shape": "annulus", "cx": "5", "cy": "4", "inner": "1.5", "outer": "4"}),
    ("odd16", "realspace-shape", {"shape": "circle", "cx": "2", "cy": "2", "outer": "1.6", "det_bin": "2",
                                  "scan_bin": "2"}),
    ("odd16", "cbed", {"sx": "1", "sy": "3"}),
    ("odd16", "cbed", {"sx": "99", "sy": "-5"}),
    ("odd16", "cbed", {"sx": "1", "sy": "2", "scan_bin": "2", "det_bin": "2"}),
    ("odd16", "cbed", {"sx": "0", "sy": "1", "row_start": "2", "row_stop": "5", "column_start": "3",
                       "column_stop": "7", "det_bin": "5"}),
    ("odd16", "cbed-region", {"shape": "circle", "cx": "3", "cy": "2", "radius": "1.1"}),
    ("odd16", "cbed-region", {"shape": "square", "cx": "3", "cy": "2", "radius": "1", "reduce": "sum"}),
    ("odd16", "cbed-region", {"shape": "circle", "cx": "0.5", "cy": "0.5", "radius": "1", "reduce": "max"}),
    ("odd16", "cbed-region", {"shape": "circle", "cx": "1", "cy": "1", "radius": "2", "scan_bin": "2",
                              "det_bin": "3"}),
    ("small8", "realspace", {}),
    ("small8", "realspace", {"mode": "ADF", "inner": "1", "outer": "3"}),
    ("small8", "realspace", {"mode": "CoMx", "scan_bin": "2", "det_bin": "4"}),
    ("small8", "cbed", {"sx": "3", "sy": "2"}),
    ("small8", "cbed-region", {"cx": "1", "cy": "1.5", "radius": "1.5", "reduce": "sum"}),
    ("narrow32", "realspace", {}),
    ("narrow32", "cbed", {"sx": "2", "sy": "1"}),
    ("narrow32", "realspace-shape", {"shape": "annulus", "cx": "3", "cy": "3", "inner": "0", "outer": "5"}),
    ("wide32", "realspace", {}),
    ("wide32", "realspace", {"mode": "CoMy"}),
    ("wide32", "cbed", {"sx": "1", "sy": "1"}),
    ("wide32", "cbed", {"sx": "0", "sy": "0", "scan_bin": "2", "det_bin": "2"}),
    ("wide32", "cbed-region", {"shape": "square", "cx": "1", "cy": "1", "radius": "1", "reduce": "max"}),
    ("overflow32", "cbed", {"sx": "1", "sy": "1", "ensure_resident": "true"}),
    ("synth", "realspace", {}),
    ("synth", "realspace", {"mode": "ABF", "inner": "0.5", "outer": "1"}),
    ("synth", "realspace", {"mode": "iCoM", "scan_bin": "2"}),
    ("synth", "cbed", {"sx": "2", "sy": "3", "det_bin": "3"}),
]


def query_string(session, stem, params):
    items = [("session", session), ("file", stem + "_master.h5")] + list(params.items())
    return urllib.parse.urlencode(items)


def error_cases(fixtures, data_root):
    odd = fixtures["odd16"]
    base = query_string(odd["session"], odd["stem"], {})
    overflow = fixtures["overflow32"]
    overflow_base = query_string(overflow["session"], overflow["stem"], {})
    overflow_text = ("Exact detector counts exceed uint32 display capacity. "
                     "Use a smaller scan bin or detector aperture.")
    pending = fixtures["pending"]
    noshape = fixtures["noshape"]
    errors = [
        ("bad_mode", "GET", "realspace", base + "&mode=bf", 400, "unknown virtual-image mode: 'bf'"),
        ("nan_inner", "GET", "realspace", base + "&inner=nan", 400, "detector center and radii must be finite"),
        ("crop_partial", "GET", "realspace", base + "&row_start=0", 400,
         "scan crop requires row_start, row_stop, column_start, and column_stop"),
        ("crop_empty", "GET", "cbed", base + "&row_start=2&row_stop=2&column_start=0&column_stop=1", 400,
         "scan crop must be a nonempty half-open (row, column) region"),
        ("crop_exceeds", "GET", "realspace", base + "&row_start=0&row_stop=6&column_start=0&column_stop=7", 400,
         "scan crop exceeds the source scan shape"),
        ("shape_name", "GET", "realspace-shape", base + "&shape=ring&outer=1", 400,
         "detector shape must be circle, square, or annulus"),
        ("shape_finite", "GET", "realspace-shape", base + "&shape=circle&cx=inf&outer=1", 400,
         "detector center and radii must be finite"),
        ("shape_radii", "GET", "realspace-shape", base + "&shape=annulus&inner=3&outer=2", 400,
         "detector radii must satisfy 0 <= inner < outer"),
        ("roi_reduce", "GET", "cbed-region", base + "&reduce=median", 400,
         "scan ROI reduction must be mean, sum, or max"),
        ("roi_shape", "GET", "cbed-region", base + "&shape=blob&ensure_resident=true", 400,
         "scan ROI shape must be circle or square"),
        ("roi_radius", "GET", "cbed-region", base + "&radius=0&ensure_resident=true", 400,
         "scan ROI radius must be greater than zero"),
        ("roi_center", "GET", "cbed-region", base + "&cy=nan&ensure_resident=true", 400,
         "scan ROI center must be finite"),
        ("roi_empty", "GET", "cbed-region", base + "&cx=40&cy=40&radius=2&ensure_resident=true", 400,
         "scan ROI does not include any scan positions"),
        ("file_slash", "GET", "cbed", "session=odd16&file=../odd16/odd16_master.h5", 400,
         "file must be one master filename"),
        ("file_dot", "GET", "cbed", "session=odd16&file=.", 400, "file must be one master filename"),
        ("file_dotdot", "GET", "cbed", "session=odd16&file=..", 404, "master not found: .."),
        ("file_shard", "GET", "cbed", "session=odd16&file=odd16_data_000001.h5", 404,
         "master not found: odd16_data_000001.h5"),
        ("session_unknown", "GET", "realspace", "session=nope&file=odd16_master.h5", 404, "unknown session: nope"),
        ("pending", "GET", "realspace", query_string(pending["session"], pending["stem"], {}), 409,
         "linked detector file is missing: " + pending["missing"]),
        ("pending_load", "POST", "load", query_string(pending["session"], pending["stem"], {}), 409,
         "linked detector file is missing: " + pending["missing"]),
        ("noshape", "GET", "realspace", query_string(noshape["session"], noshape["stem"], {}), 422,
         "The master does not report a usable 4D shape."),
        ("overflow_bf", "GET", "realspace", overflow_base, 409, overflow_text),
        ("overflow_binned_cbed", "GET", "cbed", overflow_base + "&scan_bin=2&ensure_resident=true", 409,
         overflow_text),
        ("overflow_region_sum", "GET", "cbed-region", overflow_base + "&cx=0.5&cy=0.5&radius=1&reduce=sum", 409,
         overflow_text),
    ]
    return [dict(name=n, method=m, route=r, query=q, status=s, detail=d) for n, m, r, q, s, d in errors]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["prepare"])
    parser.add_argument("root")
    parser.add_argument("--synth", nargs=3, action="append", default=[], metavar=("SESSION", "STEM", "SHAPE"))
    args = parser.parse_args()

    data_root = os.path.join(args.root, "data")
    expected_root = os.path.join(args.root, "expected")
    os.makedirs(expected_root, exist_ok=True)
    fixtures = write_fixtures(data_root)
    for session, stem, shape in args.synth:
        rows, cols = (int(x) for x in shape.split("x"))
        fixtures["synth"] = dict(session=session, stem=stem, scan=(rows, cols),
                                 master=os.path.join(data_root, session, stem + "_master.h5"))

    cases = []
    loaded = {}
    for index, (fixture_name, route, params) in enumerate(CASES):
        if fixture_name not in fixtures:
            continue
        fixture = fixtures[fixture_name]
        if fixture_name not in loaded:
            loaded[fixture_name] = read_counts(fixture["master"], tuple(fixture["scan"]))
        counts, masked_pixels, source_dtype = loaded[fixture_name]
        volume = plan_volume(counts, params)
        divisor = 1
        if route == "realspace":
            image, kind = realspace(volume, params)
        elif route == "realspace-shape":
            image, kind = realspace_shape(volume, params)
        elif route == "cbed":
            image, kind = cbed(volume, params)
        else:
            image, kind, divisor = cbed_region(volume, params)
        if kind == "exact":
            if int(image.max()) > UINT32_MAX:
                raise SystemExit("case %d overflows; move it to the error cases" % index)
            image = np.ascontiguousarray(image.astype("<u4"))
        else:
            image = np.ascontiguousarray(image.astype("<f4"))  # np.save keeps an F-ordered array F-ordered
        name = "%02d_%s_%s" % (index, fixture_name, route)
        np.save(os.path.join(expected_root, name + ".npy"), image)
        cases.append(dict(name=name, route=route, query=query_string(fixture["session"], fixture["stem"], params),
                          kind=kind, dtype=image.dtype.str, height=int(image.shape[0]), width=int(image.shape[1]),
                          divisor=divisor, cache_control=CACHE_CONTROL[route],
                          scan_bin=int(params.get("scan_bin", 1)), det_bin=int(params.get("det_bin", 1)),
                          masked_pixels=masked_pixels,
                          source_dtype=source_dtype))
    manifest = dict(cases=cases, errors=error_cases(fixtures, data_root),
                    fixtures={name: dict(session=f["session"], file=f["stem"] + "_master.h5")
                              for name, f in fixtures.items()})
    with open(os.path.join(args.root, "manifest.json"), "w") as out:
        json.dump(manifest, out, indent=1)


if __name__ == "__main__":
    main()
