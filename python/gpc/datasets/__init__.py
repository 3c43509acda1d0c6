"""Benchmark data sets of the papers, shipped as CSV, plus a loader for a user's CSV.

>>> from gpc import datasets
>>> datasets.available()                       # names accepted by datasets.load
>>> X, y = datasets.load("crabs", return_X_y=True)
>>> ds = datasets.load_glass(binary=True)      # ds.X, ds.y, ds.positive_class, ds.grouping, ...

Decisions (missing values, encodings, binary groupings) are documented in docs/datasets.md.
"""

from typing import Any

from ._base import Dataset, DatasetOrXy, load_csv
from ._loaders import (
    SHA256,
    load_australian,
    load_banana,
    load_breast_cancer,
    load_breast_cancer_wisconsin_original,
    load_crabs,
    load_glass,
    load_heart,
    load_housing,
    load_image_segment,
    load_ionosphere,
    load_pima,
    load_sonar,
    load_thyroid,
    load_wine,
)
from ._smgpc import N_SPLITS as SMGPC_N_SPLITS
from ._smgpc import SMGPC_SETS, SMGPC_SHA256, load_smgpc, sha256_smgpc, smgpc_split

_LOADERS = {
    "breast_cancer": load_breast_cancer_wisconsin_original,
    "crabs": load_crabs,
    "glass": load_glass,
    "ionosphere": load_ionosphere,
    "thyroid": load_thyroid,
    "housing": load_housing,
    "pima": load_pima,
    "sonar": load_sonar,
    "australian": load_australian,
    "heart": load_heart,
    "banana": load_banana,
    "image_segment": load_image_segment,
    "wine": load_wine,
}

# Number of classes each loader returns with its default arguments. glass, thyroid and housing are
# binary by default (the PL grouping); glass and thyroid give their original classes with binary=False.
N_CLASSES = {
    "breast_cancer": 2, "crabs": 2, "glass": 2, "ionosphere": 2, "thyroid": 2, "housing": 2,
    "pima": 2, "sonar": 2, "australian": 2, "heart": 2, "banana": 2, "image_segment": 7, "wine": 3,
}
# Sets whose source is multi-class (or continuous) and that accept binary=True/False.
GROUPED = ("glass", "thyroid", "housing")

# The data sets each paper uses (the short names of the papers: PL, NR, SEP, MF, RMGPC).
PAPERS = {
    "PL": ("breast_cancer", "crabs", "glass", "ionosphere", "thyroid", "housing"),
    "MF": ("pima", "sonar", "crabs"),
    "SEP": ("australian", "breast_cancer", "crabs", "heart", "ionosphere", "pima", "sonar", "banana",
            "image_segment"),
    "RMGPC": ("thyroid", "wine", "glass"),
}
# The scalable multi-class EP paper (SMGPC) uses eight sets with fixed splits; they load with
# load_smgpc(name), not load(name), because their names and labels follow that paper's files.



def available(binary: bool | None = None) -> list[str]:
    """Names accepted by :func:`load`.

    Parameters
    ----------
    binary : bool or None, default=None
        True: only sets that are binary with default arguments; False: only multi-class ones;
        None: all.
    """
    if binary is None:
        return list(_LOADERS)
    return [n for n in _LOADERS if (N_CLASSES[n] == 2) == bool(binary)]


def is_binary(name: str) -> bool:
    """True if ``load(name)`` with default arguments gives a two-class problem.

    Parameters
    ----------
    name : str
        One of :func:`available`.
    """
    _check_name(name)
    return N_CLASSES[name] == 2


def _check_name(name: str) -> None:
    if name not in _LOADERS:
        raise ValueError(f"unknown data set {name!r}; available: {', '.join(_LOADERS)}")


def load(name: str, **kwargs: Any) -> DatasetOrXy:
    """Load a data set by name, e.g. ``load("pima", split="test")``.

    Parameters
    ----------
    name : str
        One of :func:`available`.
    **kwargs
        Passed to the data set's loader: ``load_<name>``, and
        :func:`load_breast_cancer_wisconsin_original` for "breast_cancer" (the papers' name).
    """
    _check_name(name)
    return _LOADERS[name](**kwargs)


__all__ = [
    "Dataset", "available", "is_binary", "load", "load_csv", "N_CLASSES", "GROUPED", "PAPERS", "SHA256",
    "SMGPC_SETS", "SMGPC_N_SPLITS", "SMGPC_SHA256", "load_smgpc", "smgpc_split", "sha256_smgpc",
    *[loader.__name__ for loader in _LOADERS.values()],
]
