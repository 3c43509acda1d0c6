"""gpc.datasets.load_smgpc: the scalable multi-class EP paper's eight sets and their 20 splits."""

import hashlib

import numpy as np
import pytest

from gpc import datasets
from gpc.datasets import SMGPC_SETS, SMGPC_SHA256, load_smgpc, smgpc_split
from gpc.datasets._base import data_path

# name: (rows, features, per-class counts in target order, n_train, n_test)
EXPECTED = {
    "glass": (214, 9, [70, 76, 17, 13, 9, 29], 192, 22),
    "new-thyroid": (215, 5, [35, 30, 150], 193, 22),
    "satellite": (6435, 36, [1533, 703, 1358, 626, 707, 1508], 1287, 5148),
    "svmguide2": (391, 20, [221, 117, 53], 351, 40),
    "vehicle": (846, 18, [218, 212, 217, 199], 761, 85),
    "vowel": (540, 10, [90] * 6, 486, 54),
    "waveform": (1000, 21, [311, 350, 339], 300, 700),
    "wine": (178, 13, [59, 71, 48], 160, 18),
}


def test_the_eight_sets_and_their_files():
    assert SMGPC_SETS == tuple(EXPECTED)
    for fname, digest in SMGPC_SHA256.items():
        assert hashlib.sha256(data_path(fname).read_bytes()).hexdigest() == digest, fname
    assert len(SMGPC_SHA256) == 8


@pytest.mark.parametrize("name", list(EXPECTED))
def test_shapes_classes_and_splits(name):
    rows, d, counts, n_train, n_test = EXPECTED[name]
    ds = load_smgpc(name)
    assert ds.X.shape == (rows, d) and ds.X.dtype == np.float64 and ds.X.flags.c_contiguous
    assert np.isfinite(ds.X).all()
    assert [int(np.sum(ds.y == c)) for c in ds.target_names] == counts
    train, test = ds.extra["train"], ds.extra["test"]
    assert train.shape == (20, n_train) and test.shape == (20, n_test)
    for s in range(20):
        both = np.concatenate([train[s], test[s]])
        # disjoint and covering: every row exactly once
        assert np.array_equal(np.sort(both), np.arange(rows)), s
        # every class is in every training part
        assert set(ds.y[train[s]].tolist()) == set(ds.target_names), s
    # the splits differ from each other
    assert len({tuple(np.sort(t)) for t in test}) == 20


@pytest.mark.parametrize("name, loader", [("glass", lambda: datasets.load_glass(binary=False)),
                                          ("new-thyroid", lambda: datasets.load_thyroid(binary=False)),
                                          ("wine", datasets.load_wine)])
def test_shipped_sets_are_the_existing_rows(name, loader):
    ds, base = load_smgpc(name), loader()
    assert np.array_equal(ds.X, base.X) and np.array_equal(ds.y, base.y)


def test_smgpc_split():
    Xtr, ytr, Xte, yte = smgpc_split("vowel", 3)
    ds = load_smgpc("vowel")
    assert np.array_equal(Xtr, ds.X[ds.extra["train"][3]]) and np.array_equal(yte, ds.y[ds.extra["test"][3]])
    assert Xtr.shape == (486, 10) and Xte.shape == (54, 10) and ytr.shape == (486,)
    with pytest.raises(ValueError, match="0..19"):
        smgpc_split("vowel", 20)
    with pytest.raises(ValueError, match="satellite"):
        load_smgpc("mnist")
    Xtr2, ytr2 = load_smgpc("wine", return_X_y=True)
    assert Xtr2.shape == (178, 13)
