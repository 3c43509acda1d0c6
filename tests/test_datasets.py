"""gpc.datasets: shipped files are intact, loaders give the documented shapes and class counts, groupings
give the documented counts, and load_csv fails loudly on bad input."""

import hashlib
import warnings
from collections import Counter
from importlib import resources

import numpy as np
import pytest

from gpc import datasets
from gpc.datasets import SHA256, load_csv

# (name, kwargs) -> (rows, features, {class: count}); numbers from the data sets' own documentation (docs/datasets.md)
EXPECTED = [
    ("breast_cancer", {}, (699, 9, {"benign": 458, "malignant": 241})),
    ("breast_cancer", {"missing": "drop"}, (683, 9, {"benign": 444, "malignant": 239})),
    ("crabs", {}, (200, 6, {"F": 100, "M": 100})),
    ("glass", {"binary": False}, (214, 9, {1: 70, 2: 76, 3: 17, 5: 13, 6: 9, 7: 29})),
    ("ionosphere", {}, (351, 34, {"g": 225, "b": 126})),
    ("ionosphere", {"drop_constant": True}, (351, 33, {"g": 225, "b": 126})),
    ("thyroid", {"binary": False}, (215, 5, {"Normal": 150, "Hyper": 35, "Hypo": 30})),
    ("pima", {"split": "train"}, (200, 7, {"No": 132, "Yes": 68})),
    ("pima", {"split": "test"}, (332, 7, {"No": 223, "Yes": 109})),
    ("pima", {"split": "all"}, (532, 7, {"No": 355, "Yes": 177})),
    ("pima", {"split": "full"}, (768, 8, {"neg": 500, "pos": 268})),
    ("sonar", {}, (208, 60, {"M": 111, "R": 97})),
    ("australian", {}, (690, 14, {0: 383, 1: 307})),
    ("heart", {}, (270, 13, {1: 150, 2: 120})),
    ("banana", {}, (5300, 2, {-1: 2924, 1: 2376})),
    ("image_segment", {}, (2310, 19, {k: 330 for k in range(1, 8)})),
    ("wine", {}, (178, 13, {0: 59, 1: 71, 2: 48})),
    # binary groupings documented in docs/datasets.md
    ("glass", {}, (214, 9, {"window": 163, "non-window": 51})),
    ("thyroid", {}, (215, 5, {"normal": 150, "abnormal": 65})),
    ("housing", {}, (506, 13, {"low": 382, "high": 124})),
]


@pytest.mark.parametrize("name,kwargs,expected", EXPECTED,
                         ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items())}" for n, kw, _ in EXPECTED])
def test_shape_and_class_counts(name, kwargs, expected):
    rows, d, counts = expected
    ds = datasets.load(name, **kwargs)
    assert ds.X.shape == (rows, d)
    assert ds.X.dtype == np.float64 and ds.X.flags.c_contiguous
    assert ds.y.shape == (rows,)
    assert dict(Counter(ds.y.tolist())) == counts
    assert sorted(ds.target_names, key=str) == sorted(counts, key=str)
    assert len(ds.feature_names) == d
    assert not np.isnan(ds.X).any(), "X must hold no NaN after the documented handling"
    assert np.isfinite(ds.X).all()
    for attr in ("description", "source", "licence", "citation", "grouping"):
        assert getattr(ds, attr), attr


def test_every_registered_name_loads_with_defaults_and_matches_binary_flag():
    for name in datasets.available():
        ds = datasets.load(name)
        assert ds.is_binary == datasets.is_binary(name), name
        if ds.is_binary:
            assert ds.positive_class in ds.target_names
            assert ds.target_names[1] == ds.positive_class
            pm = ds.y_pm1()
            assert set(np.unique(pm)) == {-1.0, 1.0}
    assert set(datasets.available(binary=True)) | set(datasets.available(binary=False)) == set(
        datasets.available())
    assert datasets.available(binary=False) == ["image_segment", "wine"]
    for paper, names in datasets.PAPERS.items():
        assert set(names) <= set(datasets.available()), paper


def test_return_X_y_matches_dataset():
    X, y = datasets.load_crabs(return_X_y=True)
    ds = datasets.load_crabs()
    np.testing.assert_array_equal(X, ds.X)
    np.testing.assert_array_equal(y, ds.y)
    X2, y2 = ds  # Dataset unpacks like return_X_y
    assert X2 is ds.X and y2 is ds.y


def test_shipped_files_match_readme_sha256():
    folder = resources.files("gpc.datasets").joinpath("data")
    shipped = sorted(p.name for p in folder.iterdir() if p.name.endswith(".csv"))
    assert shipped == sorted(SHA256)
    for fname, digest in SHA256.items():
        assert hashlib.sha256(folder.joinpath(fname).read_bytes()).hexdigest() == digest, fname


def test_breast_cancer_missing_handling():
    imputed = datasets.load_breast_cancer_wisconsin_original(missing="median")
    dropped = datasets.load_breast_cancer_wisconsin_original(missing="drop")
    j = imputed.feature_names.index("V6")
    text = resources.files("gpc.datasets").joinpath("data", "breast_cancer_wisconsin.csv").read_text()
    empty = np.array([line.split(",")[j] == "" for line in text.splitlines()[1:]])
    assert empty.sum() == 16
    # the 683 complete rows are untouched and in order; the 16 others get the median of V6 (= 1)
    np.testing.assert_array_equal(imputed.X[~empty], dropped.X)
    np.testing.assert_array_equal(imputed.y[~empty], dropped.y)
    assert np.median(dropped.X[:, j]) == 1.0
    assert (imputed.X[empty, j] == 1.0).all()
    with pytest.raises(ValueError, match="missing"):
        datasets.load_breast_cancer_wisconsin_original(missing="mean")


def test_breast_cancer_old_name_warns_and_names_the_set():
    with pytest.warns(FutureWarning, match="699 x 9 Wisconsin original.*load_breast_cancer_wisconsin_original"):
        X, y = datasets.load_breast_cancer(return_X_y=True)
    X_new, y_new = datasets.load_breast_cancer_wisconsin_original(return_X_y=True)
    np.testing.assert_array_equal(X, X_new)
    np.testing.assert_array_equal(y, y_new)
    assert "load_breast_cancer" not in datasets.__all__
    assert datasets.load("breast_cancer").X.shape == (699, 9)


def test_string_labels_do_not_reach_infer_silently():
    """The set's labels are strings: passed as they are, infer refuses them; mapped by a comparison
    with a number (every row -1), infer warns of a one-class problem."""
    from gpc import infer
    _, y = datasets.load_breast_cancer_wisconsin_original(return_X_y=True)
    K = np.eye(len(y))
    with pytest.raises(ValueError, match="y must be numeric"):
        infer(K, y)
    with pytest.warns(UserWarning, match="only -1 labels, one class.*strings"):
        infer(K, np.where(y == 1, 1.0, -1.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        infer(K, np.where(y == "malignant", 1.0, -1.0))


def test_crabs_species_encoding():
    ds = datasets.load_crabs()
    assert ds.feature_names[0] == "sp"
    assert dict(Counter(ds.X[:, 0].tolist())) == {0.0: 100, 1.0: 100}
    assert ds.X[0, 0] == 0.0  # first row of the file is species B


def test_pima_mass_files_have_no_missing_zeros_but_full_file_does():
    X = datasets.load_pima(split="all").X
    assert (X[:, 1:5] == 0).sum() == 0  # glu, bp, skin, bmi: complete cases
    full = datasets.load_pima(split="full")
    cols = ["glucose", "pressure", "triceps", "insulin", "mass"]
    zeros = {c: int((full.X[:, full.feature_names.index(c)] == 0).sum()) for c in cols}
    assert zeros == {"glucose": 5, "pressure": 35, "triceps": 227, "insulin": 374, "mass": 11}
    with pytest.raises(ValueError, match="split"):
        datasets.load_pima(split="validation")


def test_housing_threshold_and_continuous_target():
    ds = datasets.load_housing(binary=False)
    assert ds.y.dtype == np.float64 and ds.y.min() == 5.0 and ds.y.max() == 50.0
    assert "medv" not in ds.feature_names
    med = datasets.load_housing(threshold=21.2)
    assert dict(Counter(med.y.tolist())) == {"low": 256, "high": 250}


def test_no_grouping_for_wine_and_image_segment():
    with pytest.raises(ValueError):
        datasets.load_wine(binary=True)
    with pytest.raises(ValueError):
        datasets.load_image_segment(binary=True)


def test_unknown_name_lists_available():
    with pytest.raises(ValueError, match="available:.*crabs"):
        datasets.load("mnist")
    with pytest.raises(ValueError):
        datasets.is_binary("nope")


# ------------------------------------------------------------------- load_csv


def _write(tmp_path, text, name="d.csv"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_load_csv_roundtrip(tmp_path):
    p = _write(tmp_path, "a,b,cls\n1,2.5,yes\n3,4,no\n5,-1e-3,yes\n")
    ds = load_csv(p, label="cls")
    np.testing.assert_array_equal(ds.X, [[1, 2.5], [3, 4], [5, -1e-3]])
    assert ds.y.tolist() == ["yes", "no", "yes"]
    assert ds.feature_names == ["a", "b"] and ds.target_names == ["no", "yes"]
    # a label column may be non-numeric, but then a string label cannot be a feature
    with pytest.raises(ValueError, match="'cls'"):
        load_csv(str(p), label="a")


def test_load_csv_integer_labels_and_shipped_file():
    path = resources.files("gpc.datasets").joinpath("data", "wine.csv")
    with resources.as_file(path) as real:
        X, y = load_csv(real, label="label", return_X_y=True)
    ds = datasets.load_wine()
    np.testing.assert_array_equal(X, ds.X)
    np.testing.assert_array_equal(y, ds.y)
    assert y.dtype == np.int64


def test_load_csv_missing_file(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_csv(missing, label="y")


def test_load_csv_unknown_label_lists_columns(tmp_path):
    p = _write(tmp_path, "a,b,cls\n1,2,x\n")
    with pytest.raises(ValueError, match="'target'.*a, b, cls"):
        load_csv(p, label="target")


def test_load_csv_non_numeric_column_named(tmp_path):
    p = _write(tmp_path, "a,colour,cls\n1,red,x\n2,blue,y\n")
    with pytest.raises(ValueError, match="'colour'.*not numeric"):
        load_csv(p, label="cls")


@pytest.mark.parametrize("cell", ["", "NA", "?", "nan"])
def test_load_csv_missing_value_named(tmp_path, cell):
    p = _write(tmp_path, f"a,b,cls\n1,2,x\n3,{cell},y\n")
    with pytest.raises(ValueError, match="'b'.*missing"):
        load_csv(p, label="cls")
