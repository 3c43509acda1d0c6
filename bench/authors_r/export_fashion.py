"""Fashion-MNIST as the raw bytes ``run_mnist.R`` reads.

    python bench/authors_r/export_fashion.py IDX_DIR OUT_DIR

IDX_DIR holds the four gzipped IDX files of Fashion-MNIST (Debian package
``dataset-fashion-mnist``; :mod:`gpc.datasets._idx`).  OUT_DIR receives, for each part ("train",
"test"), ``<part>-images.u8`` (the n × 784 pixels, row after row, one unsigned byte each, 0–255)
and ``<part>-labels.u8`` (the n class codes 0–9, one byte each): the IDX payloads without their
headers, in the files' row order, so that R reads them with ``readBin`` and nothing else.
"""

import os
import sys

from gpc.datasets._idx import FILES, read_idx


def export(idx_dir, out_dir):
    """Writes the four files; returns {part: rows}."""
    os.makedirs(out_dir, exist_ok=True)
    rows = {}
    for part, (images, labels) in FILES.items():
        X = read_idx(os.path.join(idx_dir, images))
        y = read_idx(os.path.join(idx_dir, labels))
        if len(X) != len(y):
            raise ValueError(f"{part}: {len(X)} images and {len(y)} labels")
        X.reshape(len(X), -1).tofile(os.path.join(out_dir, f"{part}-images.u8"))
        y.tofile(os.path.join(out_dir, f"{part}-labels.u8"))
        rows[part] = len(X)
    return rows


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(export(sys.argv[1], sys.argv[2]))
