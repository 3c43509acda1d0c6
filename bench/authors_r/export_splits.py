"""Write the split files that run_split.R reads, from gpc's bundled copies of the paper's eight sets.

    python bench/authors_r/export_splits.py OUT_DIR [NAME ...]

For each set, OUT_DIR/NAME/ gets X.csv (the unscaled features, one row per line), y.csv (one
class code 1..C per line), itrain.csv and itest.csv (20 lines each: the split's row numbers,
counting from 1 as R does).  Integer labels are numbered in increasing order, string labels
(new-thyroid's) in the order the classes first appear in the rows; both give the class codes of
the dgps_pep files.  R's factor() then orders the classes as those codes.
"""

import os
import sys

import numpy as np

from gpc.datasets import SMGPC_SETS, load_smgpc


def class_codes(y):
    """Integer labels numbered 1.. in increasing order; other labels 1.. by first appearance."""
    classes, first = np.unique(y, return_index=True)
    order = classes if np.issubdtype(y.dtype, np.integer) else y[np.sort(first)]
    return np.array([1 + int(np.flatnonzero(order == v)[0]) for v in y])


def export(name, out_dir):
    ds = load_smgpc(name)
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    np.savetxt(os.path.join(folder, "X.csv"), ds.X, delimiter=",", fmt="%.17g")
    np.savetxt(os.path.join(folder, "y.csv"), class_codes(ds.y), fmt="%d")
    np.savetxt(os.path.join(folder, "itrain.csv"), ds.extra["train"] + 1, delimiter=",", fmt="%d")
    np.savetxt(os.path.join(folder, "itest.csv"), ds.extra["test"] + 1, delimiter=",", fmt="%d")
    return folder


if __name__ == "__main__":
    out = sys.argv[1]
    for name in sys.argv[2:] or SMGPC_SETS:
        print("wrote", export(name, out))
