#!/usr/bin/python3
"""Crafted malformed masters for inspection tests (decision 0012), written with
h5py + numpy, independently of the daemon:

  malformed_masters.py DIR

writes into DIR, one per case, <case>_master.h5 (+ helper files):
  truncated_superblock  the first 40 bytes of a valid master (inside the superblock)
  bad_superblock        a valid master whose superblock addresses point past the end
  link_to_garbage       data_000001 -> an external file that is not HDF5
  link_to_folder        data_000001 -> an external "file" that is a folder
  link_to_fifo          data_000001 -> an external "file" that is a FIFO (opening it must not hang)
  link_to_itself        data_000001 -> external link into this same master (cycle)
  soft_link_cycle       entry/data/data is a soft link to itself
  external_cycle        data_000001 -> b.h5//x, b.h5 x -> this master's data_000001
  huge_dims             entry/data/data declared (2**40, 65536, 65536) uint16, chunked, nothing written
  huge_scan_attr        scan_shape attribute (2**62, 2**62) with a small dataset
  deep_groups           entry/data/data_000001 under 2000 nested groups of the link target
  zero_detector         entry/data/data of shape (4, 0, 0)
"""
import os
import sys

import h5py
import numpy as np


def small_master(path, **kwargs):
    with h5py.File(path, "w", **kwargs) as f:
        f.create_dataset("entry/data/data", data=np.arange(4 * 4 * 4, dtype="uint16").reshape(4, 4, 4),
                         chunks=(1, 4, 4))
        f["entry/instrument/detector/detectorSpecific/ntrigger"] = np.uint32(4)
        f["entry/instrument/detector/detectorSpecific/nimages"] = np.uint32(1)


def linking_master(path, target_file, target_path="/entry/data/data"):
    with h5py.File(path, "w") as f:
        f.create_group("entry/data")
        f["entry/data/data_000001"] = h5py.ExternalLink(target_file, target_path)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    p = lambda name: os.path.join(out, name)

    small_master(p("valid_master.h5"))
    whole = open(p("valid_master.h5"), "rb").read()
    open(p("truncated_superblock_master.h5"), "wb").write(whole[:40])

    # Superblock v0: base address at 24, then free-space, end-of-file and driver addresses (8 bytes each).
    bad = bytearray(whole)
    bad[40:48] = (2 ** 62).to_bytes(8, "little")  # end-of-file address far beyond the file
    bad[24:32] = (2 ** 40).to_bytes(8, "little")  # base address beyond the file
    open(p("bad_superblock_master.h5"), "wb").write(bytes(bad))

    open(p("garbage.h5"), "wb").write(bytes((i * 7 + 3) % 256 for i in range(4096)))
    linking_master(p("link_to_garbage_master.h5"), "garbage.h5")

    os.makedirs(p("folder.h5"), exist_ok=True)
    linking_master(p("link_to_folder_master.h5"), "folder.h5")

    if not os.path.exists(p("fifo.h5")):
        os.mkfifo(p("fifo.h5"))
    linking_master(p("link_to_fifo_master.h5"), "fifo.h5")

    linking_master(p("link_to_itself_master.h5"), "link_to_itself_master.h5", "/entry/data/data_000001")

    with h5py.File(p("soft_link_cycle_master.h5"), "w") as f:
        f.create_group("entry/data")
        f["entry/data/data"] = h5py.SoftLink("/entry/data/data")
        f["entry/data/data_000001"] = h5py.SoftLink("/entry/data/data_000002")
        f["entry/data/data_000002"] = h5py.SoftLink("/entry/data/data_000001")

    linking_master(p("external_cycle_master.h5"), "cycle_b.h5", "/x")
    with h5py.File(p("cycle_b.h5"), "w") as f:
        f["x"] = h5py.ExternalLink("external_cycle_master.h5", "/entry/data/data_000001")

    with h5py.File(p("huge_dims_master.h5"), "w") as f:
        f.create_dataset("entry/data/data", shape=(2 ** 40, 65536, 65536), dtype="uint16",
                         chunks=(1, 256, 256), maxshape=(None, 65536, 65536))
        f["entry/instrument/detector/detectorSpecific/ntrigger"] = np.uint64(2 ** 40)

    small_master(p("huge_scan_attr_master.h5"))
    with h5py.File(p("huge_scan_attr_master.h5"), "a") as f:
        f.attrs["scan_shape"] = np.array([2 ** 62, 2 ** 62], dtype="uint64")
        f["entry/instrument/detector/detectorSpecific/ntrigger"][...] = np.uint32(0xFFFFFFFF)
        f["entry/instrument/detector/detectorSpecific/nimages"][...] = np.uint32(0xFFFFFFFF)

    with h5py.File(p("deep.h5"), "w") as f:
        name = "/".join(["g"] * 2000)
        f.create_dataset(name + "/data", data=np.zeros((4, 4, 4), dtype="uint16"), chunks=(1, 4, 4))
    linking_master(p("deep_groups_master.h5"), "deep.h5", "/" + "/".join(["g"] * 2000) + "/data")

    with h5py.File(p("zero_detector_master.h5"), "w") as f:
        f.create_dataset("entry/data/data", shape=(4, 0, 0), dtype="uint16")


if __name__ == "__main__":
    main()
