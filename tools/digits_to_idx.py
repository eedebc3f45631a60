#!/usr/bin/env python3
"""Converts scikit-learn's bundled handwritten digits (1,797 real 8x8 images, pixel values
0..16, from the UCI "Optical Recognition of Handwritten Digits" set) into MNIST IDX files.

Usage:
    pip download --no-deps --only-binary=:all: scikit-learn -d /tmp/skl
    python3 tools/digits_to_idx.py /tmp/skl/scikit_learn-*.whl data/digits

The wheel is only read (as a zip); scikit-learn is not imported. Pixels are scaled from
0..16 to 0..255 (v * 255 // 16). The split is fixed: a stable permutation with seed 0
puts 1,437 samples in train and 360 in test (80/20). Writes
train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
t10k-labels-idx1-ubyte, plus SHA256SUMS.
"""

import gzip
import hashlib
import io
import os
import random
import struct
import sys
import zipfile

MEMBER = "sklearn/datasets/data/digits.csv.gz"
TEST = 360


def read_digits(source):
    """Rows of (64 pixels 0..16, label) from a wheel or from digits.csv.gz itself."""
    if source.endswith(".whl"):
        with zipfile.ZipFile(source) as z:
            raw = z.read(MEMBER)
    else:
        with open(source, "rb") as f:
            raw = f.read()
    rows = []
    for line in gzip.decompress(raw).decode().splitlines():
        if not line.strip():
            continue
        vals = [int(float(v)) for v in line.split(",")]
        if len(vals) != 65 or not all(0 <= v <= 16 for v in vals[:64]) or not 0 <= vals[64] <= 9:
            raise SystemExit(f"unexpected row: {line[:80]}")
        rows.append((vals[:64], vals[64]))
    if len(rows) != 1797:
        raise SystemExit(f"expected 1797 digits, found {len(rows)}")
    return rows


def write_idx(path, dims, data):
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, len(dims)]))
        for d in dims:
            f.write(struct.pack(">I", d))
        f.write(bytes(data))


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    rows = read_digits(sys.argv[1])
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    order = list(range(len(rows)))
    random.Random(0).shuffle(order)
    splits = {"t10k": order[:TEST], "train": order[TEST:]}
    sums = io.StringIO()
    for name, idx in splits.items():
        pixels = [v * 255 // 16 for i in idx for v in rows[i][0]]
        labels = [rows[i][1] for i in idx]
        files = {
            f"{name}-images-idx3-ubyte": ([len(idx), 8, 8], pixels),
            f"{name}-labels-idx1-ubyte": ([len(idx)], labels),
        }
        for fname, (dims, data) in files.items():
            path = os.path.join(out, fname)
            write_idx(path, dims, data)
            with open(path, "rb") as f:
                sums.write(f"{hashlib.sha256(f.read()).hexdigest()}  {fname}\n")
    with open(os.path.join(out, "SHA256SUMS"), "w") as f:
        f.write(sums.getvalue())
    print(f"wrote {len(splits['train'])} train and {len(splits['t10k'])} test digits to {out}")


if __name__ == "__main__":
    main()
