#!/usr/bin/python3
"""Independent reader for a `quantem-gpu synth` acquisition.

Usage: synth_inspect.py MASTER_PATH

Opens <prefix>_master.h5 with h5py, follows /entry/data/data_NNNNNN through
their external links, decodes every frame with the official bitshuffle filter
(hdf5plugin), and prints one JSON object: links, per-shard layout (shape,
chunks, dtype, filter id/flags/cd_values, image_nr_low/high, whether every
stored chunk equals the official encoder's output for its decoded frame), the
data (shape, dtype, sums, sha256), pixel_mask, detector metadata, the
`<prefix>.h5` STEM Metadata attributes and a few physics checks (bright-field
centroid, contrast of BF/ADF/CoM images).
"""
import hashlib
import json
import os
import struct
import sys

import bitshuffle
import h5py
import hdf5plugin  # noqa: F401  (registers the bitshuffle filter with h5py)
import numpy as np


def scalar(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return [scalar(v) for v in value.tolist()] if value.shape else scalar(value[()])
    if isinstance(value, np.generic):
        return value.item()
    return value


def official_chunk(frame):
    """12-byte bitshuffle header + the official encoder's blocks (default block size)."""
    element_size = frame.dtype.itemsize
    block_elements = max(128, (8192 // element_size) // 8 * 8)
    header = struct.pack(">QI", frame.nbytes, block_elements * element_size)
    return header + bytes(bitshuffle.compress_lz4(np.ascontiguousarray(frame)))


def inspect_shard(link_name, master, link):
    dataset = master["entry/data"][link_name]
    plist = dataset.id.get_create_plist()
    filter_id, filter_flags, cd_values, filter_name = plist.get_filter(0)
    identical = True
    stored_bytes = 0
    for index in range(dataset.shape[0]):
        mask, stored = dataset.id.read_direct_chunk((index, 0, 0))
        stored_bytes += len(stored)
        if mask != 0 or stored != official_chunk(dataset[index]):
            identical = False
    return {
        "link": link_name,
        "file": link.filename,
        "path": link.path,
        "shape": list(dataset.shape),
        "maxshape": [m if m is not None else -1 for m in dataset.maxshape],
        "chunks": list(dataset.chunks),
        "dtype": dataset.dtype.str,
        "filter_count": plist.get_nfilters(),
        "filter_id": filter_id,
        "filter_flags": filter_flags,
        "filter_name": filter_name.decode(),
        "cd_values": list(cd_values),
        "fill_value": int(dataset.fillvalue),
        "image_nr_low": int(dataset.attrs["image_nr_low"]),
        "image_nr_high": int(dataset.attrs["image_nr_high"]),
        "image_nr_dtype": dataset.attrs["image_nr_low"].dtype.str,
        "stored_bytes": stored_bytes,
        "chunks_match_official_encoder": identical,
    }


def main():
    master_path = sys.argv[1]
    folder = os.path.dirname(os.path.abspath(master_path))
    sidecar_path = master_path[: -len("_master.h5")] + ".h5"
    out = {}
    with h5py.File(master_path, "r") as master:
        data_group = master["entry/data"]
        out["signal"] = scalar(data_group.attrs["signal"])
        links = sorted(name for name in data_group if name.startswith("data_"))
        shards = []
        frames = []
        for name in links:
            link = data_group.get(name, getlink=True)
            if not isinstance(link, h5py.ExternalLink):
                raise SystemExit(f"{name} is not an external link")
            shards.append(inspect_shard(name, master, link))
            frames.append(data_group[name][...])
        out["shards"] = shards
        data = np.concatenate(frames, axis=0)

        detector = master["entry/instrument/detector"]
        specific = detector["detectorSpecific"]
        metadata = {}
        for group, names in (
            (detector, ["description", "bit_depth_image", "bit_depth_readout", "saturation_value", "x_pixel_size",
                        "count_time", "frame_time"]),
            (specific, ["nimages", "ntrigger", "trigger_mode", "x_pixels_in_detector", "y_pixels_in_detector",
                        "compression", "countrate_correction_count_cutoff", "number_of_excluded_pixels",
                        "eiger_fw_version"]),
        ):
            for name in names:
                dataset = group[name]
                metadata[name] = {"value": scalar(dataset[()]), "dtype": dataset.dtype.str if dataset.dtype.kind != "S"
                                  else "string", "shape": list(dataset.shape)}
        out["detector"] = metadata

        mask_dataset = specific["pixel_mask"]
        mask = mask_dataset[...]
        mask_plist = mask_dataset.id.get_create_plist()
        out["pixel_mask"] = {
            "dtype": mask.dtype.str,
            "shape": list(mask.shape),
            "contiguous": mask_plist.get_layout() == h5py.h5d.CONTIGUOUS,
            "filter_count": mask_plist.get_nfilters(),
            "bad": [[int(r), int(c), int(mask[r, c])] for r, c in zip(*np.nonzero(mask))],
        }

    with h5py.File(sidecar_path, "r") as sidecar:
        group = sidecar["STEM Metadata"]
        out["stem_metadata"] = {
            name: {"value": scalar(value), "dtype": value.dtype.str, "shape": list(np.shape(value))}
            for name, value in group.attrs.items()
        }

    all_ones = np.iinfo(data.dtype).max
    bad = mask != 0
    good = data[:, ~bad].astype(np.uint64)
    out["data"] = {
        "shape": list(data.shape),
        "dtype": data.dtype.str,
        "sum": int(data.astype(np.uint64).sum()),
        "sum_unmasked": int(good.sum()),
        "max_unmasked": int(good.max()),
        "all_ones_unmasked": int((good == all_ones).sum()),
        "bad_pixels_all_ones": bool(np.all(data[:, bad] == all_ones)) if bad.any() else True,
        "sha256": hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest(),
        "frame_sums": [int(s) for s in data.astype(np.uint64).sum(axis=(1, 2))],
        "files": sorted(os.listdir(folder)),
    }

    # Physics: the mean pattern's bright region and the contrast of virtual images.
    counts = data.astype(np.float64)
    counts[:, bad] = 0
    mean = counts.mean(axis=0)
    bright = mean > 0.5 * mean.max()
    rows, cols = np.nonzero(bright)
    out["physics"] = {
        "bright_centroid": [float(rows.mean()), float(cols.mean())],
        "bright_area": int(bright.sum()),
    }
    scan = int(sidecar_attrs_value(out, "NumPixelsY")), int(sidecar_attrs_value(out, "NumPixelsX"))
    if scan[0] * scan[1] == data.shape[0]:
        grid_r, grid_c = np.indices(mean.shape)
        radius = np.sqrt(bright.sum() / np.pi)
        centre = np.array(out["physics"]["bright_centroid"])
        r = np.hypot(grid_r - centre[0], grid_c - centre[1])
        bf = counts[:, r < 0.7 * radius].sum(axis=1)
        adf = counts[:, r > 1.3 * radius].sum(axis=1)
        total = counts.sum(axis=(1, 2))
        com_r = (counts * grid_r).sum(axis=(1, 2)) / total
        com_c = (counts * grid_c).sum(axis=(1, 2)) / total
        out["physics"].update({
            "bf_relative_std": float(bf.std() / bf.mean()),
            "adf_relative_std": float(adf.std() / adf.mean()),
            "com_row_std": float(com_r.std()),
            "com_col_std": float(com_c.std()),
        })
    json.dump(out, sys.stdout)


def sidecar_attrs_value(out, name):
    value = out["stem_metadata"][name]["value"]
    return value[0] if isinstance(value, list) else value


if __name__ == "__main__":
    main()
