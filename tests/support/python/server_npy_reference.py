"""Writes numpy.save() of a reference array, for the .npy encoder tests.

usage: server_npy_reference.py OUT_PATH DTYPE ROWS COLS
The array is arange(ROWS*COLS) * 65537 (wrapping in the dtype), reshaped C-order.
"""
import sys

import numpy as np


def main():
    out_path, dtype, rows, cols = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    values = (np.arange(rows * cols, dtype=np.uint64) * np.uint64(65537)) % np.uint64(2**32)
    if dtype == "<f4":
        array = (values.astype(np.float64) / 7.0).astype("<f4")
    else:
        array = values.astype(dtype)
    np.save(out_path, array.reshape(rows, cols))


if __name__ == "__main__":
    main()
