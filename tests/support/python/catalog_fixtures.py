#!/usr/bin/python3
"""Catalog test fixtures and references, written with h5py + hdf5plugin (the
official bitshuffle filter) + numpy, independently of the daemon.

Subcommands:
  acquisition DIR STEM [options]   an Eiger/Arina-style master (+ data files)
  batch SPECFILE                   one `acquisition` argument line per line (one interpreter start)
  data-file PATH [options]         a standalone data file /entry/data/data
  chunk-info PATH DATASET [PATH...] JSON list of every allocated chunk as HDF5 reports it
                                   (dset.id.get_chunk_info), with an FNV-1a 64 hash of its raw
                                   bytes (dset.id.read_direct_chunk)
"""
import argparse
import json
import os
import shlex
import sys

import h5py
import hdf5plugin  # noqa: F401  (registers the bitshuffle / LZ4 filters)
import numpy as np


def parse_pair(text):
    rows, cols = text.lower().split("x")
    return int(rows), int(cols)


def filter_kwargs(name, dtype):
    if name == "bslz4":
        return dict(**hdf5plugin.Bitshuffle(nelems=0, cname="lz4"))
    if name == "bszstd":
        return dict(**hdf5plugin.Bitshuffle(nelems=0, cname="zstd"))
    if name == "lz4":
        return dict(**hdf5plugin.LZ4())
    if name == "gzip":
        return dict(compression="gzip", compression_opts=1)
    if name in ("none", "contiguous"):
        return {}
    raise SystemExit("unknown filter " + name)


def frames_for(first, count, det, dtype, seed):
    rng = np.random.default_rng(seed + first)
    high = {"uint8": 200, "uint16": 1000, "uint32": 70000, "int16": 1000, "float32": 1000}[dtype]
    data = rng.integers(0, high, size=(count,) + det)
    return data.astype(dtype)


def write_dataset(group, name, frames, det, dtype, args, written=None):
    """Creates group[name] with `frames` frames; writes the first `written` (all by default)."""
    written = frames if written is None else written
    kwargs = filter_kwargs(args.filter, dtype)
    shape = (frames,) + det
    if args.filter == "contiguous":
        dset = group.create_dataset(name, shape=shape, dtype=dtype)
    else:
        chunk_frames = min(max(1, args.chunk_frames), max(1, frames))
        maxshape = (None,) + det if (args.unlimited or frames == 0) else None
        if args.alloc_early:
            # Early allocation: with libver latest, no filter and fixed dims, HDF5 uses the implicit index.
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            kwargs["dcpl"] = dcpl
        dset = group.create_dataset(name, shape=shape, dtype=dtype, chunks=(chunk_frames,) + det,
                                    maxshape=maxshape, **kwargs)
    for start in range(0, written, 256):
        count = min(256, written - start)
        dset[start:start + count] = frames_for(start + args.frame_base, count, det, dtype, args.seed)
    return dset


def file_kwargs(args):
    kwargs = {}
    if args.libver:
        kwargs["libver"] = args.libver
    if args.userblock:
        kwargs["userblock_size"] = args.userblock
    return kwargs


def make_acquisition(argv):
    p = argparse.ArgumentParser(prog="acquisition")
    p.add_argument("dir")
    p.add_argument("stem")
    p.add_argument("--shard-frames", default="4",
                   help="frames per data file, comma separated; 'inline:N[,M]' for inline; 'none' for no source")
    p.add_argument("--det", default="4x4")
    p.add_argument("--dtype", default="uint16")
    p.add_argument("--det-per-shard", help="RxC per shard, comma separated")
    p.add_argument("--dtype-per-shard", help="dtype per shard, comma separated")
    p.add_argument("--raw-shape", help="inline only: entry/data/data with exactly this shape (comma separated)")
    p.add_argument("--write-dataset", help="path of the dataset written in data files (default: --link-dataset)")
    p.add_argument("--ntrigger", type=int)
    p.add_argument("--nimages", type=int)
    p.add_argument("--filter", default="bslz4")
    p.add_argument("--chunk-frames", type=int, default=1)
    p.add_argument("--unlimited", action="store_true", help="maxshape (None, rows, cols)")
    p.add_argument("--alloc-early", action="store_true", help="H5D_ALLOC_TIME_EARLY")
    p.add_argument("--shard-name", default="{stem}_data_{i:06d}.h5")
    p.add_argument("--link-name", default="data_{i:06d}")
    p.add_argument("--link-dataset", default="/entry/data/data")
    p.add_argument("--absolute-links", action="store_true")
    p.add_argument("--missing-shards", default="", help="1-based shard numbers not written")
    p.add_argument("--unwritten", type=int, default=-1, help="write only this many frames of shard 1")
    p.add_argument("--scan-shape", action="append", default=[],
                   help="WHERE:R,C with WHERE in root, entry_data, dataset, root_dataset")
    p.add_argument("--sidecar", help="Y,X[,PRESCAN] NumPixelsY, NumPixelsX, NumPixelsPrescan")
    p.add_argument("--root-attr", action="append", default=[], help="NAME=VALUE (float, or 'str:TEXT')")
    p.add_argument("--mask", help="RxC:DTYPE[:r,c=v;r,c=v...]")
    p.add_argument("--libver")
    p.add_argument("--userblock", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--frame-base", type=int, default=0)
    args = p.parse_args(argv)

    os.makedirs(args.dir, exist_ok=True)
    det = parse_pair(args.det)
    master_path = os.path.join(args.dir, args.stem + "_master.h5")
    missing = {int(x) for x in args.missing_shards.split(",") if x}
    inline = args.shard_frames.startswith("inline:")
    shard_frames = [] if args.shard_frames == "none" else [
        int(x) for x in args.shard_frames.split(":")[-1].split(",") if x]
    dets = [parse_pair(x) for x in args.det_per_shard.split(",")] if args.det_per_shard else [det] * len(shard_frames)
    dtypes = args.dtype_per_shard.split(",") if args.dtype_per_shard else [args.dtype] * len(shard_frames)
    write_path = args.write_dataset or args.link_dataset

    with h5py.File(master_path, "w", **file_kwargs(args)) as master:
        entry = master.create_group("entry")
        data = entry.create_group("data")
        spec = master.create_group("entry/instrument/detector/detectorSpecific")
        if args.ntrigger is not None:
            spec.create_dataset("ntrigger", data=np.uint64(args.ntrigger) if args.ntrigger >= 0 else np.int64(args.ntrigger))
        if args.nimages is not None:
            spec.create_dataset("nimages", data=np.int64(args.nimages))
        if args.mask:
            parts = args.mask.split(":")
            mask = np.zeros(parse_pair(parts[0]), dtype=parts[1])
            if len(parts) > 2 and parts[2]:
                for item in parts[2].split(";"):
                    where, value = item.split("=")
                    r, c = (int(v) for v in where.split(","))
                    mask[r, c] = int(value, 0)
            spec.create_dataset("pixel_mask", data=mask)
        for item in args.root_attr:
            name, value = item.split("=", 1)
            master.attrs[name] = value[4:] if value.startswith("str:") else float(value)

        first_dataset = None
        base = 0
        if inline and args.raw_shape:
            shape = tuple(int(v) for v in args.raw_shape.split(","))
            first_dataset = data.create_dataset("data", data=np.zeros(shape, dtype=args.dtype))
        elif inline:
            names = ["data"] if len(shard_frames) == 1 else [args.link_name.format(i=i + 1) for i in range(len(shard_frames))]
            for name, frames, shard_det, shard_dtype in zip(names, shard_frames, dets, dtypes):
                args.frame_base = base
                dset = write_dataset(data, name, frames, shard_det, shard_dtype, args)
                first_dataset = first_dataset or dset
                base += frames
        else:
            for index, (frames, shard_det, shard_dtype) in enumerate(zip(shard_frames, dets, dtypes), start=1):
                file_name = args.shard_name.format(stem=args.stem, i=index)
                file_path = os.path.join(args.dir, file_name)
                target = os.path.abspath(file_path) if args.absolute_links else file_name
                data[args.link_name.format(i=index)] = h5py.ExternalLink(target, args.link_dataset)
                if index in missing:
                    base += frames
                    continue
                os.makedirs(os.path.dirname(os.path.abspath(file_path)), exist_ok=True)
                with h5py.File(file_path, "w", **file_kwargs(args)) as shard:
                    group = shard.require_group(os.path.dirname(write_path))
                    args.frame_base = base
                    written = args.unwritten if (index == 1 and args.unwritten >= 0) else None
                    dset = write_dataset(group, os.path.basename(write_path), frames, shard_det, shard_dtype, args,
                                         written)
                    dset.attrs["image_nr_low"] = np.uint64(base + 1)
                    dset.attrs["image_nr_high"] = np.uint64(base + frames)
                    for item in args.scan_shape:
                        where, value = item.split(":")
                        if where == "dataset":
                            dset.attrs["scan_shape"] = np.array([int(v) for v in value.split(",")], dtype=np.int64)
                base += frames
        for item in args.scan_shape:
            where, value = item.split(":")
            shape = np.array([int(v) for v in value.split(",")], dtype=np.int64)
            if where == "root":
                master.attrs["scan_shape"] = shape
            elif where == "entry_data":
                data.attrs["scan_shape"] = shape
            elif where == "root_dataset":
                master.create_dataset("scan_shape", data=shape)
            elif where == "dataset" and inline:
                first_dataset.attrs["scan_shape"] = shape

    if args.sidecar:
        values = [int(v) for v in args.sidecar.split(",")]
        with h5py.File(os.path.join(args.dir, args.stem + ".h5"), "w") as sidecar:
            group = sidecar.create_group("STEM Metadata")
            group.attrs["NumPixelsY"] = np.int64(values[0])
            group.attrs["NumPixelsX"] = np.int64(values[1])
            group.attrs["NumPixelsPrescan"] = np.array([values[2] if len(values) > 2 else 0], dtype=np.uint32)


def make_data_file(argv):
    p = argparse.ArgumentParser(prog="data-file")
    p.add_argument("path")
    p.add_argument("--frames", type=int, default=4)
    p.add_argument("--det", default="4x4")
    p.add_argument("--dtype", default="uint16")
    p.add_argument("--filter", default="bslz4")
    p.add_argument("--chunk-frames", type=int, default=1)
    p.add_argument("--unlimited", action="store_true")
    p.add_argument("--alloc-early", action="store_true")
    p.add_argument("--libver")
    p.add_argument("--userblock", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--unwritten", type=int, default=-1)
    args = p.parse_args(argv)
    args.frame_base = 0
    det = parse_pair(args.det)
    with h5py.File(args.path, "w", **file_kwargs(args)) as f:
        group = f.require_group("entry/data")
        write_dataset(group, "data", args.frames, det, args.dtype, args,
                      args.unwritten if args.unwritten >= 0 else None)


def fnv1a64(data):
    value = 0xCBF29CE484222325
    for byte in data:
        value ^= byte
        value = (value * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


def describe_chunks(path, dataset):
    with h5py.File(path, "r") as f:
        dset = f[dataset]
        if dset.chunks is None:
            return {"shape": list(dset.shape), "contiguous_offset": dset.id.get_offset()}
        chunks = []
        for i in range(dset.id.get_num_chunks()):
            info = dset.id.get_chunk_info(i)
            mask, raw = dset.id.read_direct_chunk(info.chunk_offset)
            chunks.append({"offset": list(info.chunk_offset), "byte_offset": info.byte_offset, "size": info.size,
                           "filter_mask": info.filter_mask, "fnv1a64": str(fnv1a64(raw)), "raw_size": len(raw)})
        return {"shape": list(dset.shape), "chunks": chunks}


def chunk_info(argv):
    p = argparse.ArgumentParser(prog="chunk-info")
    p.add_argument("path")
    p.add_argument("dataset")
    p.add_argument("more_paths", nargs="*", help="further files (same dataset): prints {path: info}")
    args = p.parse_args(argv)
    if not args.more_paths:
        json.dump(describe_chunks(args.path, args.dataset), sys.stdout)
    else:
        json.dump({path: describe_chunks(path, args.dataset) for path in [args.path] + args.more_paths}, sys.stdout)


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    command, argv = sys.argv[1], sys.argv[2:]
    if command == "acquisition":
        make_acquisition(argv)
    elif command == "batch":
        with open(argv[0]) as spec:
            for line in spec:
                if line.strip() and not line.startswith("#"):
                    make_acquisition(shlex.split(line))
    elif command == "data-file":
        make_data_file(argv)
    elif command == "chunk-info":
        chunk_info(argv)
    else:
        raise SystemExit("unknown command " + command)


if __name__ == "__main__":
    main()
