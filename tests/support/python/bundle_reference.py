"""Reads an npz bundle with numpy, as a curl user would, for the bundle tests.

usage: bundle_reference.py NPZ_PATH OUT_DIR
Checks every member's CRC (zipfile.testzip), then writes numpy.save() of each
array to OUT_DIR/<name>.npy and the names in the archive's order to
OUT_DIR/names.txt, one a line.
"""
import os
import sys
import zipfile

import numpy as np


def main():
    npz_path, out_dir = sys.argv[1], sys.argv[2]
    with zipfile.ZipFile(npz_path) as archive:
        bad = archive.testzip()
        if bad is not None:
            sys.exit("bad CRC in member " + bad)
    with np.load(npz_path) as bundle:
        names = list(bundle.files)
        for name in names:
            np.save(os.path.join(out_dir, name + ".npy"), bundle[name])
    with open(os.path.join(out_dir, "names.txt"), "w") as out:
        out.write("".join(name + "\n" for name in names))


if __name__ == "__main__":
    main()
