"""Dataset container, CSV reading (standard library only) and data-file lookup via importlib.resources."""

from __future__ import annotations

import csv
import hashlib
import io
import os
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, Iterator, Union

import numpy as np

if TYPE_CHECKING:
    import sys

    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:
        from importlib.abc import Traversable

__all__ = ["Dataset", "load_csv", "data_path", "sha256_of"]

DATA_PACKAGE = "gpc.datasets"  # files live in its data/ folder (no __init__ needed there)

# Text that a CSV cell may hold to mean "missing". The shipped files only use the empty field.
_MISSING_TOKENS = frozenset({"", "na", "nan", "n/a", "?", "null", "none"})


@dataclass
class Dataset:
    """A loaded data set (Bunch-like: attributes, and ``X, y = ds`` also works).

    Attributes
    ----------
    X : ndarray of float64, shape (n, d)
    y : ndarray, shape (n,). Labels as the source codes them (strings or ints), or the
        group names of a documented binary grouping.
    feature_names, target_names : list of str. ``target_names`` lists the classes present; for a
        binary set it is ``[negative, positive]``.
    positive_class : the label of ``y`` treated as the positive class (+1) for binary sets, else None.
    description, source, licence, citation, grouping : str
    name : registry name of the set.
    extra : dict. Further per-set data: ``load_smgpc`` puts its 20 splits here (``train``, ``test``).
    """

    X: np.ndarray
    y: np.ndarray
    feature_names: list
    target_names: list
    name: str = ""
    description: str = ""
    source: str = ""
    licence: str = ""
    citation: str = ""
    grouping: str = ""
    positive_class: object = None
    extra: dict = field(default_factory=dict)

    def __iter__(self) -> Iterator[np.ndarray]:
        # Lets ``X, y = dataset`` work like ``return_X_y=True``.
        return iter((self.X, self.y))

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def keys(self) -> list[str]:
        return [f for f in self.__dataclass_fields__]

    @property
    def is_binary(self) -> bool:
        return len(self.target_names) == 2

    @property
    def n_samples(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    def y_pm1(self) -> np.ndarray:
        """Labels as float +1 (``positive_class``) / -1 (the other class); only for binary sets."""
        if not self.is_binary or self.positive_class is None:
            raise ValueError(f"data set {self.name!r} is not binary; y_pm1() needs two classes")
        return np.where(self.y == self.positive_class, 1.0, -1.0)

    def __repr__(self) -> str:
        classes = ", ".join(f"{c}: {int(np.sum(self.y == c))}" for c in self.target_names)
        return (f"Dataset(name={self.name!r}, X={self.X.shape}, classes={{{classes}}}, "
                f"positive_class={self.positive_class!r})")


#: What a loader returns: a Dataset, or ``(X, y)`` when called with ``return_X_y=True``.
DatasetOrXy = Union[Dataset, tuple[np.ndarray, np.ndarray]]


def data_path(filename: str) -> Traversable:
    """A Traversable for a shipped data file (works in wheels and editable installs)."""
    return resources.files(DATA_PACKAGE).joinpath("data").joinpath(filename)


def _read_text(filename: str) -> str:
    return data_path(filename).read_text(encoding="utf-8")


def sha256_of(filename: str) -> str:
    """SHA-256 hex digest of a shipped data file, as bytes on disk."""
    return hashlib.sha256(data_path(filename).read_bytes()).hexdigest()


def _read_rows(text: str) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(text)))
    rows = [r for r in rows if r]  # tolerate a trailing blank line
    if not rows:
        raise ValueError("empty CSV")
    return rows[0], rows[1:]


def _to_float(cell: str, column: str, allow_missing: bool) -> float:
    s = cell.strip()
    if s.lower() in _MISSING_TOKENS:
        if allow_missing:
            return np.nan
        raise ValueError(f"column {column!r} has a missing value ({cell!r}); "
                         "fill or drop it before loading")
    try:
        return float(s)
    except ValueError:
        raise ValueError(f"column {column!r} is not numeric (value {cell!r}); "
                         "only numeric feature columns are supported — encode or drop it") from None


def _parse_labels(cells: list[str], column: str = "label") -> np.ndarray:
    """Labels as int64 if every cell is an integer literal, else as str."""
    stripped = [c.strip() for c in cells]
    for s in stripped:
        if s.lower() in _MISSING_TOKENS:
            raise ValueError(f"label column {column!r} has a missing value")
    try:
        return np.array([int(s) for s in stripped], dtype=np.int64)
    except ValueError:
        return np.array(stripped, dtype=str)


def _read_table(filename: str | None, label: str = "label", allow_missing: bool = False,
                text: str | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Read a shipped CSV: (X float64, y, feature_names, raw rows, header)."""
    if text is None:
        if filename is None:
            raise ValueError("_read_table needs a shipped file name or the text of a CSV")
        text = _read_text(filename)
    header, rows = _read_rows(text)
    header = [h.strip() for h in header]
    if label not in header:
        raise ValueError(f"label column {label!r} not found; columns are: {', '.join(header)}")
    li = header.index(label)
    feats = [i for i in range(len(header)) if i != li]
    for k, r in enumerate(rows):
        if len(r) != len(header):
            raise ValueError(f"row {k + 2} has {len(r)} fields, header has {len(header)}")
    X = np.empty((len(rows), len(feats)), dtype=np.float64)
    for j, i in enumerate(feats):
        col = header[i]
        X[:, j] = [_to_float(r[i], col, allow_missing) for r in rows]
    y = _parse_labels([r[li] for r in rows], label)
    return X, y, [header[i] for i in feats]


def load_csv(path: str | os.PathLike[str], label: str, *,
             return_X_y: bool = False) -> DatasetOrXy:
    """Load a user's CSV file: numeric feature columns plus one label column.

    Parameters
    ----------
    path : str or os.PathLike. The file must have one header row; comma separated.
    label : name of the label column (any values; integer labels become int64, others str).
    return_X_y : if True, return ``(X, y)`` instead of a Dataset.

    Raises
    ------
    FileNotFoundError : the file does not exist (the message gives the path).
    ValueError : ``label`` is not a column (the message lists the columns); a feature column is not
        numeric or has a missing value (empty, NA, NaN, ?) — the message names the column. No
        imputation or encoding is done: prepare the file first.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"CSV file not found: {path}")
    with open(path, encoding="utf-8", newline="") as fh:
        text = fh.read()
    X, y, names = _read_table(None, label=label, allow_missing=False, text=text)
    if X.shape[0] == 0:
        raise ValueError(f"{path} has a header but no data rows")
    if X.shape[1] == 0:
        raise ValueError(f"{path} has no feature columns besides the label {label!r}")
    if return_X_y:
        return X, y
    classes = sorted(np.unique(y).tolist())
    return Dataset(X=X, y=y, feature_names=names, target_names=classes,
                   name=os.path.basename(path), description=f"user CSV {path}, label column {label!r}",
                   source=path, grouping="none: labels as in the file",
                   positive_class=classes[-1] if len(classes) == 2 else None)
