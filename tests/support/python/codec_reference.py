#!/usr/bin/python3
"""Independent reference for the chunk codec tests: h5py + the official HDF5
filters (bitshuffle 32008 through hdf5plugin / the system plugin, LZ4 32004)
+ numpy. Nothing here uses quantem code.

Sub-commands (every output file lands in OUTDIR; the manifest goes to stdout):

  export H5FILE DATASET OUTDIR
      For every chunk of DATASET: the stored bytes (read_direct_chunk) and the
      decoded chunk as read through the official filter (dset[...]).
  generate OUTDIR
      Writes generated.h5 with bitshuffle+LZ4 datasets of u8/u16/u32 (awkward
      element counts, block sizes, sparse/zero/max/random/diffraction-like
      frames), checks the official filter reads back the source exactly, and
      exports every chunk as `export` does.
  roundtrip MANIFEST OUTDIR
      MANIFEST lines: NAME FILTER_ID ELEMENT_SIZE ELEMENT_COUNT BLOCK_ELEMENTS CHUNK_FILE.
      Writes each chunk with write_direct_chunk into a dataset declared with
      that filter, reads it back through the filter and writes
      OUTDIR/NAME.decoded (or prints `error NAME MESSAGE` if the filter fails).

Manifest lines printed by export/generate:
  chunk FILTER_ID LABEL INDEX ELEMENT_SIZE ELEMENT_COUNT BLOCK_ELEMENTS CHUNK_FILE FRAME_FILE
BLOCK_ELEMENTS is the dataset's requested bitshuffle block (cd_values[3], 0 = default).
"""
import os
import sys

import h5py
import hdf5plugin  # noqa: F401  (registers the filters with h5py/HDF5)
import numpy as np

BITSHUFFLE = 32008
LZ4 = 32004


def dataset_filter(dset):
    plist = dset.id.get_create_plist()
    filters = [plist.get_filter(i) for i in range(plist.get_nfilters())]
    if len(filters) != 1:
        raise SystemExit(f"{dset.name}: expected exactly one filter, got {filters}")
    filter_id, _flags, cd_values, _name = filters[0]
    block_elements = cd_values[3] if filter_id == BITSHUFFLE and len(cd_values) > 3 else 0
    return filter_id, block_elements


def export_dataset(dset, label, outdir, expected=None):
    filter_id, block_elements = dataset_filter(dset)
    chunk_shape = dset.chunks
    element_size = dset.dtype.itemsize
    element_count = int(np.prod(chunk_shape))
    for index in range(dset.id.get_num_chunks()):
        info = dset.id.get_chunk_info(index)
        offset = info.chunk_offset
        filter_mask, stored = dset.id.read_direct_chunk(offset)
        if filter_mask != 0:
            raise SystemExit(f"{label} chunk {index}: filter mask {filter_mask} (filter skipped)")
        region = tuple(slice(o, o + c) for o, c in zip(offset, chunk_shape))
        decoded = np.ascontiguousarray(dset[region]).astype(dset.dtype.newbyteorder("<"), copy=False)
        if decoded.size != element_count:
            raise SystemExit(f"{label} chunk {index}: partial edge chunk not supported")
        if expected is not None and not np.array_equal(decoded, expected[region]):
            raise SystemExit(f"{label} chunk {index}: official filter does not read back the source")
        stem = os.path.join(outdir, f"{label}.{index:06d}")
        with open(stem + ".chunk", "wb") as out:
            out.write(stored)
        with open(stem + ".frame", "wb") as out:
            out.write(decoded.tobytes())
        print(f"chunk {filter_id} {label} {index} {element_size} {element_count} {block_elements} "
              f"{stem}.chunk {stem}.frame")


def command_export(path, dataset, outdir):
    label = os.path.splitext(os.path.basename(path))[0]
    with h5py.File(path, "r") as f:
        export_dataset(f[dataset], label, outdir)


def frame_kinds(rng, dtype, element_count):
    """Four frames: sparse Poisson-like counts with rare bright pixels, all
    zero, all max, uniformly random (incompressible)."""
    top = np.iinfo(dtype).max
    sparse = rng.poisson(0.3, element_count).astype(np.int64)
    bright = rng.random(element_count) < 0.01
    sparse[bright] = rng.integers(0, top, int(bright.sum()), endpoint=True)
    return np.stack([
        np.clip(sparse, 0, top).astype(dtype),
        np.zeros(element_count, dtype),
        np.full(element_count, top, dtype),
        rng.integers(0, top, element_count, endpoint=True, dtype=dtype),
    ])


def diffraction_frames(rng, dtype, frames, side=192):
    """Sparse electron-counting frames: a bright disc plus diffuse counts."""
    rows, cols = np.mgrid[0:side, 0:side]
    result = np.empty((frames, side * side), dtype)
    for index in range(frames):
        centre_row, centre_col = side / 2 + rng.normal(0, 3, 2)
        disc = (rows - centre_row) ** 2 + (cols - centre_col) ** 2 < 24 ** 2
        mean = np.where(disc, 8.0, 0.05)
        counts = rng.poisson(mean).ravel()
        result[index] = np.clip(counts, 0, np.iinfo(dtype).max).astype(dtype)
    return result


def command_generate(outdir):
    rng = np.random.default_rng(20240601)
    path = os.path.join(outdir, "generated.h5")
    element_counts = [8, 12, 16, 100, 1000, 4095, 4096, 4100, 4108, 8191, 8192, 8200, 36864, 36867, 65541]
    datasets = []  # (name, data, block_elements)
    for dtype in (np.uint8, np.uint16, np.uint32):
        width = np.dtype(dtype).itemsize * 8
        for count in element_counts:
            datasets.append((f"u{width}_n{count}_default", frame_kinds(rng, dtype, count), 0))
        datasets.append((f"u{width}_frame192_default", diffraction_frames(rng, dtype, 4), 0))
    for dtype, count, block in [(np.uint16, 36864, 8), (np.uint16, 36864, 16), (np.uint16, 36864, 1024),
                                (np.uint16, 36864, 65536), (np.uint16, 36867, 2048), (np.uint8, 4100, 64),
                                (np.uint32, 1000, 256), (np.uint32, 12, 8)]:
        width = np.dtype(dtype).itemsize * 8
        datasets.append((f"u{width}_n{count}_block{block}", frame_kinds(rng, dtype, count), block))

    with h5py.File(path, "w") as f:
        for name, data, block in datasets:
            f.create_dataset(name, data=data, chunks=(1, data.shape[1]),
                             compression=hdf5plugin.Bitshuffle(nelems=block, cname="lz4"))
    with h5py.File(path, "r") as f:
        for name, data, _block in datasets:
            export_dataset(f[name], name, outdir, expected=data)


def command_roundtrip(manifest, outdir):
    path = os.path.join(outdir, "roundtrip.h5")
    with open(manifest) as lines, h5py.File(path, "w") as f:
        entries = [line.split() for line in lines if line.strip()]
        for name, filter_id, element_size, element_count, block_elements, chunk_file in entries:
            dtype = np.dtype(f"<u{element_size}")
            if int(filter_id) == BITSHUFFLE:
                compression = hdf5plugin.Bitshuffle(nelems=int(block_elements), cname="lz4")
                dset = f.create_dataset(name, shape=(1, int(element_count)), dtype=dtype,
                                        chunks=(1, int(element_count)), compression=compression)
            else:
                dset = f.create_dataset(name, shape=(1, int(element_count)), dtype=dtype,
                                        chunks=(1, int(element_count)), compression=int(filter_id),
                                        allow_unknown_filter=True)
            with open(chunk_file, "rb") as chunk:
                dset.id.write_direct_chunk((0, 0), chunk.read(), 0)
    with h5py.File(path, "r") as f:
        for name, *_rest in entries:
            try:
                decoded = f[name][0]
            except Exception as error:  # the official filter rejected our chunk
                print(f"error {name} {str(error).splitlines()[0]}")
                continue
            with open(os.path.join(outdir, name + ".decoded"), "wb") as out:
                out.write(decoded.astype(decoded.dtype.newbyteorder("<"), copy=False).tobytes())
            print(f"decoded {name}")


def main(argv):
    if len(argv) >= 2 and argv[1] == "export" and len(argv) == 5:
        command_export(argv[2], argv[3], argv[4])
    elif len(argv) == 3 and argv[1] == "generate":
        command_generate(argv[2])
    elif len(argv) == 4 and argv[1] == "roundtrip":
        command_roundtrip(argv[2], argv[3])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
