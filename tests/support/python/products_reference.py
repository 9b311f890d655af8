#!/usr/bin/env python3
"""Independent numpy reference for the browse products (docs/protocol.md, "Products",
with the tightenings of "4. Tightened rules").

Usage: products_reference.py WORKDIR
Reads WORKDIR/data.npy (4-D counts, source dtype), WORKDIR/mask.npy (uint8 detector
mask, 1 = bad pixel) and WORKDIR/cases.json; writes WORKDIR/expected.json.

Everything is computed from the plain array with numpy: masked pixels zeroed,
half-open crop, scan and detector bins as uint64 block sums with partial edges kept
(zero padding), bright-field fit in float64 from the exact mean pattern, detector
masks in float64 on integer pixel centres, CoM as float32(moment / total), iCoM
with numpy's float64 FFT.
"""
import json
import math
import sys

import numpy as np


def binned_volume(data, mask, crop, scan_bin, det_bin):
    volume = data.astype(np.uint64)
    volume[:, :, mask != 0] = 0
    if crop is not None:
        r0, r1, c0, c1 = crop
        volume = volume[r0:r1, c0:c1]
    rows, cols, det_rows, det_cols = volume.shape
    out_rows, out_cols = -(-rows // scan_bin), -(-cols // scan_bin)
    padded = np.zeros((out_rows * scan_bin, out_cols * scan_bin, det_rows, det_cols), np.uint64)
    padded[:rows, :cols] = volume
    volume = padded.reshape(out_rows, scan_bin, out_cols, scan_bin, det_rows, det_cols).sum(axis=(1, 3), dtype=np.uint64)
    out_det_rows, out_det_cols = -(-det_rows // det_bin), -(-det_cols // det_bin)
    padded = np.zeros((out_rows, out_cols, out_det_rows * det_bin, out_det_cols * det_bin), np.uint64)
    padded[:, :, :det_rows, :det_cols] = volume
    return padded.reshape(out_rows, out_cols, out_det_rows, det_bin, out_det_cols, det_bin).sum(axis=(3, 5), dtype=np.uint64)


def bright_field_fit(volume):
    rows, cols, height, width = volume.shape
    pattern = volume.sum(axis=(0, 1), dtype=np.uint64)
    mean_pattern = pattern.astype(np.float64) / float(rows * cols)
    threshold = mean_pattern.mean() + mean_pattern.std()
    above = mean_pattern > threshold
    if not above.any():
        return height / 2, width / 2, min(height, width) / 4
    r, c = np.nonzero(above)
    return float(r.mean()), float(c.mean()), math.sqrt(int(above.sum()) / math.pi)


def distance_squared(height, width, cy, cx):
    rows, cols = np.ogrid[:height, :width]
    return (rows - cy) ** 2 + (cols - cx) ** 2


def masked_sum(volume, mask):
    return (volume * mask.astype(np.uint64)[None, None]).sum(axis=(2, 3), dtype=np.uint64)


def center_of_mass(volume):
    height, width = volume.shape[2:]
    total = volume.sum(axis=(2, 3), dtype=np.uint64)
    row_moment = (volume * np.arange(height, dtype=np.uint64)[None, None, :, None]).sum(axis=(2, 3), dtype=np.uint64)
    col_moment = (volume * np.arange(width, dtype=np.uint64)[None, None, None, :]).sum(axis=(2, 3), dtype=np.uint64)
    com_row = np.zeros(total.shape, np.float32)
    com_col = np.zeros(total.shape, np.float32)
    nonzero = total != 0
    com_row[nonzero] = (row_moment[nonzero].astype(np.float64) / total[nonzero].astype(np.float64)).astype(np.float32)
    com_col[nonzero] = (col_moment[nonzero].astype(np.float64) / total[nonzero].astype(np.float64)).astype(np.float32)
    return com_row, com_col


def integrate(com_row, com_col):
    g_row = com_row.astype(np.float64)
    g_col = com_col.astype(np.float64)
    nu_row, nu_col = np.meshgrid(np.fft.fftfreq(g_row.shape[0]), np.fft.fftfreq(g_row.shape[1]), indexing="ij")
    k_squared = nu_row ** 2 + nu_col ** 2
    k_squared[0, 0] = 1.0
    phase_fft = (-0.25j) * (nu_row * np.fft.fft2(g_row) + nu_col * np.fft.fft2(g_col)) / k_squared
    phase_fft[0, 0] = 0
    phase = np.real(np.fft.ifft2(phase_fft))
    return -(phase - phase.mean())


def roi_positions(shape, cy, cx, radius, rows, cols):
    row_lo, row_hi = max(0, math.ceil(cy - radius)), min(rows - 1, math.floor(cy + radius))
    col_lo, col_hi = max(0, math.ceil(cx - radius)), min(cols - 1, math.floor(cx + radius))
    positions = []
    for row in range(row_lo, row_hi + 1):
        for col in range(col_lo, col_hi + 1):
            if shape == "square" or (row - cy) ** 2 + (col - cx) ** 2 <= radius ** 2:
                positions.append(row * cols + col)
    return positions


def counts(array):
    return [int(v) for v in np.asarray(array).ravel()]


def floats(array):
    return [float(v) for v in np.asarray(array).ravel()]


def run_request(volume, fit, request):
    rows, cols, height, width = volume.shape
    kind = request["kind"]
    if kind == "realspace":
        mode = request["mode"]
        if mode in ("CoMx", "CoMy", "CoMmag", "DPC", "iCoM"):
            com_row, com_col = center_of_mass(volume)
            if mode == "CoMy":
                return {"values": floats(com_row)}
            if mode == "CoMx":
                return {"values": floats(com_col)}
            if mode in ("CoMmag", "DPC"):
                return {"values": floats(np.hypot(com_row, com_col).astype(np.float32))}
            return {"values": floats(integrate(com_row, com_col))}
        fit_row, fit_col, radius = fit
        cy = fit_row if request["cy"] is None else request["cy"]
        cx = fit_col if request["cx"] is None else request["cx"]
        inner_px = max(0.0, request["inner"] * radius)
        outer_px = max(inner_px + 1.0, request["outer"] * radius)
        d2 = distance_squared(height, width, cy, cx)
        if mode == "BF":
            mask = d2 <= outer_px ** 2
        else:
            mask = (d2 >= inner_px ** 2) & (d2 <= outer_px ** 2)
        return {"counts": counts(masked_sum(volume, mask)), "inner_px": inner_px, "outer_px": outer_px}
    if kind == "shape":
        cy, cx, inner, outer = request["cy"], request["cx"], request["inner"], request["outer"]
        d2 = distance_squared(height, width, cy, cx)
        if request["shape"] == "circle":
            mask = d2 <= outer ** 2
        elif request["shape"] == "annulus":
            mask = (d2 >= inner ** 2) & (d2 <= outer ** 2)
        else:
            r, c = np.ogrid[:height, :width]
            mask = (np.abs(r - cy) <= outer) & (np.abs(c - cx) <= outer)
        return {"counts": counts(masked_sum(volume, mask))}
    if kind == "cbed":
        row = max(0, min(rows - 1, request["row"]))
        col = max(0, min(cols - 1, request["col"]))
        return {"counts": counts(volume[row, col])}
    if kind == "region":
        positions = roi_positions(request["shape"], request["cy"], request["cx"], request["radius"], rows, cols)
        frames = volume.reshape(rows * cols, height, width)[positions]
        if request["reduce"] == "max":
            return {"counts": counts(frames.max(axis=0)), "divisor": 1}
        divisor = len(positions) if request["reduce"] == "mean" else 1
        return {"counts": counts(frames.sum(axis=0, dtype=np.uint64)), "divisor": divisor}
    raise ValueError(f"unknown request kind {kind}")


def main():
    workdir = sys.argv[1]
    data = np.load(f"{workdir}/data.npy")
    mask = np.load(f"{workdir}/mask.npy")
    with open(f"{workdir}/cases.json") as handle:
        cases = json.load(handle)["cases"]
    expected = []
    for case in cases:
        volume = binned_volume(data, mask, case["crop"], case["scan_bin"], case["det_bin"])
        fit = bright_field_fit(volume)
        expected.append({
            "scan_shape": list(volume.shape[:2]),
            "detector_shape": list(volume.shape[2:]),
            "bright_field": list(fit),
            "results": [run_request(volume, fit, request) for request in case["requests"]],
        })
    with open(f"{workdir}/expected.json", "w") as handle:
        json.dump({"cases": expected}, handle)


if __name__ == "__main__":
    main()
