"""The eight UCI sets of the scalable multi-class EP paper with their 20 train/test splits.

Villacampa-Calvo & Hernández-Lobato (ICML 2017) compare EP, SEP, VI and GFITC on glass,
new-thyroid, satellite, svmguide2, vehicle, vowel, waveform and wine, each over 20 fixed splits.
The splits (and the data of the five sets gpc did not ship before) are those of the first author's
repository ``cvillacampa/dgps_pep`` (Apache-2.0), file ``datasets/multiclass.tgz``; its satellite
splits are the first 20 of the 100 in the paper's supplementary code.  They are shipped as one
compressed ``data/smgpc/<name>.npz`` per set: ``train`` and ``test``, arrays of shape
(20, n_train) and (20, n_test) of 0-based row indices, and for the five new sets ``X`` and ``y``.
Glass, new-thyroid and wine are the rows of :func:`load_glass`, :func:`load_thyroid` and
:func:`load_wine` in the same order (checked cell by cell when bundled), so only their splits are
stored.  Provenance and licences: docs/datasets.md.
"""

from __future__ import annotations

import hashlib
import io
from typing import cast

import numpy as np

from ._base import Dataset, DatasetOrXy, data_path
from ._loaders import _finish, _multiclass_targets, load_glass, load_thyroid, load_wine

#: the paper's eight sets, in its table's order
SMGPC_SETS = ("glass", "new-thyroid", "satellite", "svmguide2", "vehicle", "vowel", "waveform", "wine")

#: number of splits shipped per set
N_SPLITS = 20

SMGPC_SHA256 = {
    "smgpc/glass.npz": "725ff3c31aa314f04183ba8a169e5a558cd0dd4c039504caee47751bdd49274f",
    "smgpc/new_thyroid.npz": "7f16a9011c2d8ccac3a59ea0b003279dda7394ee529c9e63365e8bd0bcac006d",
    "smgpc/satellite.npz": "b193caf4b279c96ad3ff8f540515b713f80134d4a51975b1581e64db108e5b1d",
    "smgpc/svmguide2.npz": "7b2f259e0a8f906552cc40866d52a62da247eb8fde31ca2a4e2f0e86b21cede7",
    "smgpc/vehicle.npz": "d73e714b7dd920dc37897cbce5ea7b11a1b5380e7220a20aa5a0c249b9f7fc59",
    "smgpc/vowel.npz": "9b0b118067419280c54ec24d6a10a5a7965606cd7dd715ad1221d5b082e83849",
    "smgpc/waveform.npz": "1836a56b74d26760193d7b26f8fff2f4011a0f176fe35fcf6305c2300bff0256",
    "smgpc/wine.npz": "d103097e533834bb82932110af52fd7271072215ed24036f879eefed731a2a08",
}

_SOURCE = "GitHub cvillacampa/dgps_pep @ 30ce21f, datasets/multiclass.tgz ({}/data.npz, {}/folds.npz)"
_LIC_DGPS = "dgps_pep: Apache-2.0 (repository); the UCI set's own terms apply to the data"

# name: (loader of the rows gpc already ships, or None; description; citation)
_META = {
    "glass": (lambda: load_glass(binary=False), "", ""),
    "new-thyroid": (lambda: load_thyroid(binary=False), "", ""),
    "wine": (load_wine, "", ""),
    "satellite": (None, "Statlog Landsat satellite: 3 x 3 pixel neighbourhoods in 4 spectral bands "
                        "(36 integer features), 6 soil classes; the UCI training and test files together.",
                  "Srinivasan (1993), UCI Statlog (Landsat Satellite)"),
    "svmguide2": (None, "svmguide2 from the LIBSVM data page: 20 features scaled to [0, 0.21], 3 classes.",
                  "Hsu, Chang & Lin (2003), A practical guide to support vector classification"),
    "vehicle": (None, "Statlog vehicle silhouettes: 18 integer shape features, 4 vehicle classes.",
                "Siebert (1987), Turing Institute; UCI Statlog (Vehicle Silhouettes)"),
    "vowel": (None, "Vowel recognition (Deterding): 540 rows of 6 vowel classes (90 each); feature 0 "
                    "is the speaker index 0-14, features 1-9 the log-area-ratio coefficients (as shipped "
                    "by dgps_pep; which 6 of UCI's 11 vowels is not stated there).",
              "Deterding (1989); UCI Connectionist Bench (Vowel Recognition)"),
    "waveform": (None, "Breiman's waveform generator (version 1): 1000 rows of 21 noisy features, "
                       "3 classes (a subset of UCI's 5000, as shipped by dgps_pep).",
                 "Breiman, Friedman, Olshen & Stone (1984); UCI Waveform Database Generator (Version 1)"),
}


def _file(name: str) -> str:
    if name not in SMGPC_SETS:
        raise ValueError(f"unknown data set {name!r}; the scalable multi-class EP sets are: "
                         f"{', '.join(SMGPC_SETS)}")
    return "smgpc/" + name.replace("-", "_") + ".npz"


def _read(name: str) -> dict:
    raw = data_path(_file(name)).read_bytes()
    with np.load(io.BytesIO(raw)) as npz:
        return {k: npz[k] for k in npz.files}


def sha256_smgpc(name: str) -> str:
    """SHA-256 hex digest of the shipped file of one of the paper's sets.

    Parameters
    ----------
    name : str
        One of :data:`SMGPC_SETS`.

    Returns
    -------
    str
        The digest, to compare with ``SMGPC_SHA256[name]``.
    """
    return hashlib.sha256(data_path(_file(name)).read_bytes()).hexdigest()


def load_smgpc(name: str, *, return_X_y: bool = False) -> DatasetOrXy:
    """One of the paper's eight sets, with its 20 splits in ``extra``.

    Parameters
    ----------
    name : str
        One of :data:`SMGPC_SETS`.
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 (n, d), unscaled; ``y`` int64 class codes 1..C for the five sets new here,
        the labels of :func:`load_glass` (``binary=False``), :func:`load_thyroid` (``binary=False``)
        and :func:`load_wine` for the other three.  ``extra["train"]`` and ``extra["test"]``: int64
        arrays (20, n_train) and (20, n_test) of row indices; in every split the two are disjoint
        and together cover the rows once.
    """
    arrays = _read(name)
    shipped, description, citation = _META[name]
    if shipped is not None:
        base = cast(Dataset, shipped())
        X, y = base.X, base.y
        description, citation, names = base.description, base.citation, base.feature_names
        licence, source = base.licence, base.source + "; splits: " + _SOURCE.format(name, name)
    else:
        X = arrays["X"].astype(np.float64)
        y = arrays["y"].astype(np.int64)
        names = [f"x{j}" for j in range(X.shape[1])]
        licence, source = _LIC_DGPS, _SOURCE.format(name, name)
    ds = Dataset(X=X, y=y, feature_names=names, target_names=_multiclass_targets(y), name=name,
                 description=description, source=source, licence=licence, citation=citation,
                 grouping="none: the source's classes",
                 extra={"train": arrays["train"].astype(np.int64),
                        "test": arrays["test"].astype(np.int64)})
    return _finish(ds, return_X_y)


def smgpc_split(name: str, split: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(X_train, y_train, X_test, y_test)`` of split ``split`` (0-based, < 20) of one set, unscaled.

    Parameters
    ----------
    name : str
        One of :data:`SMGPC_SETS`.
    split : int
        0 .. 19; the authors' R scripts number the same splits 1 .. 20.
    """
    if not 0 <= split < N_SPLITS:
        raise ValueError(f"split must be in 0..{N_SPLITS - 1}, got {split}")
    ds = cast(Dataset, load_smgpc(name))
    tr, te = ds.extra["train"][split], ds.extra["test"][split]
    return ds.X[tr], ds.y[tr], ds.X[te], ds.y[te]
