"""The first hour of a new user: estimators that agree with each other and with scikit-learn's
conventions, messages that print plain values, results that say what they are."""

import warnings

import numpy as np
import pytest

from helpers import run_cli

from gpc import (GaussianProcessClassifier, MultiClassGPC, SparseGaussianProcessClassifier,
                 SparseMultiClassGPC)


def _blobs(n, classes, seed=0, d=2):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    X = rng.normal(size=(n, d)) + 2.0 * np.eye(classes, d)[y]
    return X, y


# -- n_inducing above n: both sparse estimators warn and use n ------------------------------------
@pytest.mark.parametrize("cls, classes", [(SparseGaussianProcessClassifier, 2),
                                          (SparseMultiClassGPC, 3)])
def test_n_inducing_above_n_warns_and_uses_n(cls, classes):
    X, y = _blobs(24, classes)
    clf = cls(n_inducing=50, inducing_points="random", max_iter=2, random_state=0)
    with pytest.warns(UserWarning, match=r"n_inducing=50 is more than the 24 training rows"):
        clf.fit(X, y)
    # every training row is an inducing point
    Z = clf.inducing_points_ if hasattr(clf, "inducing_points_") else None
    assert Z is not None
    Zs = Z if isinstance(Z, list) else [Z]
    for Zk in Zs:
        assert np.asarray(Zk).shape == (24, 2)


# -- messages print plain values ------------------------------------------------------------------
@pytest.mark.parametrize("cls", [GaussianProcessClassifier, MultiClassGPC,
                                 SparseGaussianProcessClassifier, SparseMultiClassGPC])
@pytest.mark.parametrize("label, shown", [(np.int64(3), "3"), (np.str_("a"), "'a'")])
def test_one_class_message_prints_the_label_plainly(cls, label, shown):
    X, _ = _blobs(12, 2)
    y = np.full(12, label)
    with pytest.raises(ValueError) as info:
        cls().fit(X, y)
    message = str(info.value)
    assert "np." not in message
    # the drop-in keeps scikit-learn's wording, "(only class a is present)"
    assert any(f"class {v}" in message or f"class ({v})" in message for v in (shown, shown.strip("'")))


# -- sep-distributed takes --quiet ----------------------------------------------------------------
@pytest.mark.parametrize("quiet", [False, True])
def test_sep_distributed_quiet(monkeypatch, capsys, quiet):
    """``--quiet`` is accepted and leaves out the progress lines on stderr; the table stays.  The
    cluster is replaced by the in-process fit, so the test needs no Dask."""
    import contextlib

    from gpc.distributed import cli

    @contextlib.contextmanager
    def in_process(**how):
        yield None

    monkeypatch.setattr(cli, "open_client", in_process)
    argv = ["sep-distributed", "--dask-workers", "1", "--synthetic", "200", "--n-inducing", "5",
            "--max-iter", "2"] + (["--quiet"] if quiet else [])
    code, out, err = run_cli(argv, capsys)
    assert code in (None, 0), err
    assert "1 worker" in out and "in process" in out
    assert ("sep-distributed: fitting" in err) is not quiet


# -- reproduce pl-table1: its folds in the title, the cores by default, resumable -----------------
_TINY = dict(dataset_names=["crabs"], likelihoods=["probit"], methods=["laplace"], n_folds=3,
             jobs=1, progress=False)


def test_pl_table1_resumes_after_an_interrupt(tmp_path, monkeypatch):
    """An interrupt after the first fold keeps that fold in the cache; the rerun computes only the
    other two and gives the table of an uninterrupted run, bit for bit (JSON keeps floats
    exactly)."""
    from gpc.experiments import pl_table1

    fit = pl_table1._fit_fold
    whole = pl_table1.run(**_TINY)
    calls = []

    def interrupted(task):
        if calls:
            raise KeyboardInterrupt
        calls.append(task)
        return fit(task)

    cache = tmp_path / "folds.jsonl"
    monkeypatch.setattr(pl_table1, "_fit_fold", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pl_table1.run(**_TINY, cache=str(cache))
    assert len(cache.read_text().splitlines()) == 1

    def counted(task):
        calls.append(task)
        return fit(task)

    calls.clear()
    monkeypatch.setattr(pl_table1, "_fit_fold", counted)
    resumed = pl_table1.run(**_TINY, cache=str(cache))
    assert len(calls) == 2
    assert resumed == whole
    assert len(cache.read_text().splitlines()) == 3
    assert pl_table1.format_table(resumed).startswith("PL Table I: 3-fold CV error")


def test_pl_table1_jobs_default_to_the_available_cores(tmp_path, monkeypatch, capsys):
    import os

    from gpc.experiments import pl_table1

    seen = {}

    def fake_run(*args, **kwargs):
        seen.update(kwargs)
        return []

    monkeypatch.setattr(pl_table1, "run", fake_run)
    code, _, err = run_cli(["reproduce", "pl-table1", "--datasets", "crabs", "--quiet"], capsys)
    assert code in (None, 0), err
    assert seen["jobs"] == len(os.sched_getaffinity(0))
    # an explicit --jobs wins, and --out puts the cache next to it
    out = tmp_path / "t.json"
    code, _, err = run_cli(["reproduce", "pl-table1", "--datasets", "crabs", "--quiet", "--jobs", "1",
                            "--out", str(out)], capsys)
    assert code in (None, 0), err
    assert seen["jobs"] == 1 and seen["cache"] == str(out) + ".folds.jsonl"
