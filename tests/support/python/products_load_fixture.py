#!/usr/bin/python3
"""Acquisitions for the CPU backend's load tests, written and read back with h5py
+ hdf5plugin (the official bitshuffle filter) + numpy, independently of the daemon.

Subcommands:
  write DIR STEM [options]   an Arina-style master with external links to bitshuffle-LZ4
                             shards, then DIR/STEM_expected.u64 (see `read`)
  read MASTER OUT [--scan RxC]  the 4-D counts of any master read through h5py, masked pixels
                             (pixel_mask != 0) zeroed, as little-endian uint64 [R][C][H][W]
  corrupt PATH FRAME         breaks one stored chunk of PATH:/entry/data/data in place (its
                             first LZ4 block claims more bytes than the chunk holds)
"""
import argparse
import os
import sys

import h5py
import hdf5plugin
import numpy as np


def parse_pair(text):
    rows, cols = text.lower().split("x")
    return int(rows), int(cols)


def make_frames(count, first, det, dtype, seed, hot, masked, masked_value):
    """Random counts with a bright disk; `hot` > 0 puts that value in one unmasked pixel per frame."""
    rng = np.random.default_rng(seed + first)
    rows, cols = det
    r, c = np.ogrid[:rows, :cols]
    disk = (r - rows / 2) ** 2 + (c - cols / 2) ** 2 <= (min(rows, cols) / 4) ** 2
    high = {"uint8": 120, "uint16": 3000, "uint32": 3000}[dtype]
    frames = rng.integers(0, 3, size=(count, rows, cols)).astype(np.uint64)
    frames += (rng.integers(high // 2, high, size=(count, rows, cols)) * disk).astype(np.uint64)
    for i in range(count):
        if hot:
            pixel = (first + i) * 7 % (rows * cols)
            if not masked[pixel // cols, pixel % cols]:
                frames[i, pixel // cols, pixel % cols] = hot
    frames[:, masked] = masked_value
    return frames.astype(dtype)


def read_counts(master_path, scan=None):
    with h5py.File(master_path, "r") as master:
        data = master["entry/data"]
        names = sorted(name for name in data if name.startswith("data_")) or ["data"]
        frames = np.concatenate([data[name][...] for name in names], axis=0)
        spec = master.get("entry/instrument/detector/detectorSpecific")
        mask = None
        if spec is not None and "pixel_mask" in spec:
            mask = spec["pixel_mask"][...] != 0
        shape = scan or master.attrs.get("scan_shape")
        if shape is None:
            side = int(round(len(frames) ** 0.5))
            shape = (side, side)
        rows, cols = (int(v) for v in shape)
    counts = frames.astype(np.uint64)
    if mask is not None:
        counts[:, mask] = 0
    return counts.reshape(rows, cols, frames.shape[1], frames.shape[2])


def write(argv):
    p = argparse.ArgumentParser(prog="write")
    p.add_argument("dir")
    p.add_argument("stem")
    p.add_argument("--scan", default="4x4")
    p.add_argument("--det", default="8x8")
    p.add_argument("--dtype", default="uint16")
    p.add_argument("--shard-frames", default="", help="frames per shard, comma separated (default: one shard)")
    p.add_argument("--mask", default="", help="masked pixels r,c;r,c")
    p.add_argument("--masked-value", type=int, default=1, help="count written into masked pixels")
    p.add_argument("--hot", type=int, default=0, help="count of one unmasked pixel per frame")
    p.add_argument("--raw-frames", default="", help="frames stored unfiltered (filter mask 1), comma separated")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-expected", action="store_true", help="skip STEM_expected.u64")
    p.add_argument("--filter", default="bslz4", choices=["bslz4", "lz4"], help="shard compression")
    p.add_argument("--block-elements", type=int, default=0,
                   help="bitshuffle block size in elements (0: the filter's default, 8192 bytes)")
    p.add_argument("--inline", action="store_true",
                   help="no shards: an uncompressed contiguous entry/data/data inside the master")
    args = p.parse_args(argv)

    scan = parse_pair(args.scan)
    det = parse_pair(args.det)
    total = scan[0] * scan[1]
    shard_frames = [int(v) for v in args.shard_frames.split(",") if v] or [total]
    assert sum(shard_frames) == total
    masked = np.zeros(det, dtype=bool)
    for item in filter(None, args.mask.split(";")):
        r, c = (int(v) for v in item.split(","))
        masked[r, c] = True
    raw_frames = {int(v) for v in args.raw_frames.split(",") if v}

    os.makedirs(args.dir, exist_ok=True)
    master_path = os.path.join(args.dir, args.stem + "_master.h5")
    with h5py.File(master_path, "w") as master:
        master.attrs["scan_shape"] = np.array(scan, dtype=np.int64)
        data = master.create_group("entry/data")
        spec = master.create_group("entry/instrument/detector/detectorSpecific")
        spec.create_dataset("ntrigger", data=np.uint64(total))
        spec.create_dataset("nimages", data=np.uint64(1))
        spec.create_dataset("pixel_mask", data=masked.astype(np.uint32))
        if args.inline:
            frames = make_frames(total, 0, det, args.dtype, args.seed, args.hot, masked, args.masked_value)
            data.create_dataset("data", data=frames)
            shard_frames = []
        compression = (hdf5plugin.Bitshuffle(nelems=args.block_elements, cname="lz4") if args.filter == "bslz4" else hdf5plugin.LZ4())
        first = 0
        for index, count in enumerate(shard_frames, start=1):
            name = f"{args.stem}_data_{index:06d}.h5"
            data[f"data_{index:06d}"] = h5py.ExternalLink(name, "/entry/data/data")
            frames = make_frames(count, first, det, args.dtype, args.seed, args.hot, masked, args.masked_value)
            with h5py.File(os.path.join(args.dir, name), "w") as shard:
                dset = shard.create_dataset("entry/data/data", shape=(count,) + det, dtype=args.dtype,
                                            chunks=(1,) + det, **compression)
                for i in range(count):
                    if first + i in raw_frames:
                        dset.id.write_direct_chunk((i, 0, 0), frames[i].tobytes(), filter_mask=1)
                    else:
                        dset[i] = frames[i]
            first += count
    if not args.no_expected:
        read_counts(master_path).astype("<u8").tofile(os.path.join(args.dir, args.stem + "_expected.u64"))


def read(argv):
    p = argparse.ArgumentParser(prog="read")
    p.add_argument("master")
    p.add_argument("out")
    p.add_argument("--scan", help="RxC (default: the root scan_shape attribute, else a square)")
    args = p.parse_args(argv)
    scan = parse_pair(args.scan) if args.scan else None
    read_counts(args.master, scan).astype("<u8").tofile(args.out)


def corrupt(argv):
    p = argparse.ArgumentParser(prog="corrupt")
    p.add_argument("path")
    p.add_argument("frame", type=int)
    args = p.parse_args(argv)
    with h5py.File(args.path, "r") as f:
        dset = f["entry/data/data"]
        info = dset.id.get_chunk_info_by_coord((args.frame, 0, 0))
    # Bitshuffle-LZ4 chunk: 8-byte total size, 4-byte block size, then the first
    # block's 4-byte big-endian compressed length.
    with open(args.path, "r+b") as handle:
        handle.seek(info.byte_offset + 12)
        handle.write(b"\x7f\xff\xff\xff")


def main():
    commands = {"write": write, "read": read, "corrupt": corrupt}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        raise SystemExit(__doc__)
    commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
