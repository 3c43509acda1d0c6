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

    from gpc.experiments import sep_distributed as cli

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


# -- scikit-learn's test_warning_bounds with gpc's default EP -------------------------------------
_X_SK = np.atleast_2d(np.linspace(0, 10, 30)).T      # scikit-learn's test_gpc data
_Y_SK = np.array(np.sin(_X_SK).ravel() > 0, dtype=int)


def _fit_recording(kernel):
    clf = GaussianProcessClassifier(kernel=kernel)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        clf.fit(_X_SK, _Y_SK)
    # a scikit-learn kernel warns with scikit-learn's ConvergenceWarning, a gpc kernel with gpc's
    return clf, [str(r.message) for r in record if r.category.__name__ == "ConvergenceWarning"]


def test_warning_bounds_scikit_learn_kernels():
    """scikit-learn's test_warning_bounds, with EP: the length scale, started below its bounds,
    is clipped to 1e3 and moved off it by one step of 1e-4 in log ℓ that L-BFGS-B's tolerance
    cannot tell from the bound, so both bound warnings come, in scikit-learn's words."""
    sk = pytest.importorskip("sklearn.gaussian_process.kernels")
    _, messages = _fit_recording(sk.RBF(length_scale_bounds=[1e-5, 1e-3]))
    assert messages == [
        "The optimal value found for dimension 0 of parameter length_scale is close to the "
        "specified upper bound 0.001. Increasing the bound and calling fit again may find a "
        "better value."]
    kernel = sk.WhiteKernel(noise_level_bounds=[1e-5, 1e-3]) + sk.RBF(length_scale_bounds=[1e3, 1e5])
    clf, messages = _fit_recording(kernel)
    assert messages == [
        "The optimal value found for dimension 0 of parameter k1__noise_level is close to the "
        "specified upper bound 0.001. Increasing the bound and calling fit again may find a "
        "better value.",
        "The optimal value found for dimension 0 of parameter k2__length_scale is close to the "
        "specified lower bound 1000.0. Decreasing the bound and calling fit again may find a "
        "better value."]
    # the warning does not move the fitted θ: it stays where the optimiser left it
    assert clf.kernel_.theta[1] > np.log(1e3)
    # a length scale well inside its bounds draws no warning
    _, messages = _fit_recording(sk.RBF(1.0, length_scale_bounds=[1e-2, 1e2]))
    assert messages == []


def test_warning_bounds_gpc_kernels():
    from gpc.kernels import RBF, WhiteKernel

    _, messages = _fit_recording(WhiteKernel(1.0, (1e-5, 1e-3)) + RBF(1.0, (1e3, 1e5)))
    assert len(messages) == 2
    assert "noise_level" in messages[0] and "upper bound" in messages[0]
    assert "length_scale" in messages[1] and "lower bound" in messages[1]


# -- feature_names_in_, as scikit-learn sets and checks it ----------------------------------------
_SMALL = {GaussianProcessClassifier: dict(), MultiClassGPC: dict(max_iter=20),
          SparseGaussianProcessClassifier: dict(n_inducing=5, max_iter=2),
          SparseMultiClassGPC: dict(n_inducing=5, max_iter=2)}


@pytest.mark.parametrize("cls", list(_SMALL), ids=lambda c: c.__name__)
def test_feature_names_in(cls):
    pd = pytest.importorskip("pandas")
    X, y = _blobs(30, 3 if "Multi" in cls.__name__ else 2)
    frame = pd.DataFrame(X, columns=["a", "b"])
    clf = cls(random_state=0, **_SMALL[cls]).fit(frame, y)
    assert list(clf.feature_names_in_) == ["a", "b"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # the same names: no warning
        p = clf.predict_proba(frame)
    renamed = frame.rename(columns={"b": "c"})
    with pytest.raises(ValueError, match=r"Feature names unseen at fit time:\n- c\n"):
        clf.predict(renamed)
    with pytest.raises(ValueError, match="Feature names must be in the same order"):
        clf.predict_proba(frame[["b", "a"]])
    with pytest.warns(UserWarning, match="X does not have valid feature names, but "
                                         f"{cls.__name__} was fitted with feature names"):
        np.testing.assert_array_equal(clf.predict_proba(X), p)
    # refitted on an array: the names are gone, and a frame at prediction warns
    clf.fit(X, y)
    assert not hasattr(clf, "feature_names_in_")
    with pytest.warns(UserWarning, match=f"X has feature names, but {cls.__name__} was fitted "
                                         "without feature names"):
        clf.predict(frame)


def test_local_feature_name_check_matches_scikit_learn():
    """The rule used without scikit-learn gives scikit-learn's attribute, messages and errors."""
    pd = pytest.importorskip("pandas")
    validation = pytest.importorskip("sklearn.utils.validation")
    from gpc._validation import _local_check_feature_names

    class Est:
        pass

    fitted = pd.DataFrame(np.zeros((2, 7)), columns=list("abcdefg"))
    cases = [fitted, fitted[list("gfedcba")], fitted.rename(columns=dict(zip("abcdefg", "hijklmn"))),
             fitted.iloc[:, :3], np.zeros((2, 7)), pd.DataFrame(np.zeros((2, 2)), columns=["a", 1])]
    outcomes = []
    for check in (validation._check_feature_names, _local_check_feature_names):
        got = []
        for case in cases:
            est = Est()
            check(est, fitted, reset=True)
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                try:
                    check(est, case, reset=False)
                    got.append(("ok", [str(r.message) for r in record]))
                except (ValueError, TypeError) as exc:
                    got.append((type(exc).__name__, str(exc)))
        est = Est()
        check(est, np.zeros((2, 7)), reset=True)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            check(est, fitted, reset=False)
        got.append(("no names at fit", [str(r.message) for r in record], hasattr(est, "feature_names_in_")))
        outcomes.append(got)
    assert outcomes[0] == outcomes[1]
    assert outcomes[1][2][0] == "ValueError" and outcomes[1][5][0] == "TypeError"


# -- exploring: InferenceResult's repr, posterior.predict's shapes, infer's default --------------
def _problem(n=20, seed=0):
    from helpers import rbf, toy

    X, y = toy(n, seed)
    return rbf(X) + 1e-6 * np.eye(n), y


def test_inference_result_repr_is_a_short_summary():
    from gpc import infer

    K, y = _problem()
    result = infer(K, y, method="ep")
    text = repr(result)
    assert text == (f"InferenceResult(method='ep', schedule='sequential', n=20, "
                    f"log_evidence={result.log_evidence:.6g}, converged=True, "
                    f"n_iter={result.n_iter})")
    assert "bound method" not in text and len(text) < 120
    assert repr(infer(K, y)).startswith("InferenceResult(method='laplace', n=20, ")


@pytest.mark.parametrize("method", ["laplace", "ep", "mf-naive"])
def test_posterior_predict_names_the_expected_shapes(method):
    from gpc import infer

    K, y = _problem()
    result = infer(K, y, method=method)
    K_cross, k_diag = K[:, :5], np.diag(K)[:5]
    mean, var = result.predict(K_cross, k_diag)
    assert mean.shape == var.shape == (5,)
    with pytest.raises(ValueError, match=r"shape \(n_train, n_test\) = \(20, m\).*got shape "
                                         r"\(5, 20\) \(it looks transposed: pass K_cross.T\)"):
        result.predict(K_cross.T, k_diag)
    with pytest.raises(ValueError, match=r"k_diag .* shape \(5,\); got shape \(4,\)"):
        result.posterior.predict(K_cross, k_diag[:4])
    with pytest.raises(ValueError, match=r"K_cross must be 2-D"):
        result.predict(K_cross[:, 0], k_diag[:1])


def test_infer_documents_why_its_default_differs_from_the_estimators():
    import inspect

    from gpc import infer

    default = inspect.signature(infer).parameters["method"].default
    estimator_default = GaussianProcessClassifier()._resolve()[0]
    assert (default, estimator_default) == ("laplace", "ep")
    doc = " ".join(infer.__doc__.split())
    assert 'method : str, default "laplace"' in doc
    assert "defaults to EP" in doc and 'Pass ``method="ep"`` for the estimator\'s posterior' in doc


# -- type hints on the public API ----------------------------------------------------------------
_PUBLIC = ("fit", "partial_fit", "predict", "predict_proba", "log_marginal_likelihood")


@pytest.mark.parametrize("cls", list(_SMALL), ids=lambda c: c.__name__)
def test_public_methods_are_annotated(cls):
    import inspect

    checked = 0
    for name in _PUBLIC:
        method = cls.__dict__.get(name)
        if method is None:
            continue
        method = getattr(method, "fn", method)     # the drop-in's partial_fit descriptor
        sig = inspect.signature(inspect.unwrap(method))
        missing = [p.name for p in sig.parameters.values()
                   if p.name != "self" and p.annotation is inspect.Parameter.empty]
        assert not missing, f"{cls.__name__}.{name}: {missing} not annotated"
        assert sig.return_annotation is not inspect.Signature.empty, f"{cls.__name__}.{name}"
        checked += 1
    assert checked >= 3


def test_infer_is_annotated():
    import inspect

    from gpc import infer

    sig = inspect.signature(infer)
    assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values())
    assert sig.return_annotation is not inspect.Signature.empty


def test_compare_split_message_prints_the_label_plainly():
    from gpc.experiments.compare import holdout_split

    y = np.array([0] * 10 + [7], dtype=np.int64)
    with pytest.raises(ValueError, match=r"^class 7 has 1 rows"):
        holdout_split(np.zeros((11, 2)), y, 0.3, 0)


def test_exact_estimators_report_progress_when_verbose(capsys):
    """verbose=1: one stderr line per optimiser start of each problem; 2: also one per evaluation;
    0 (the default) prints nothing."""
    from sklearn.gaussian_process.kernels import RBF as SkRBF

    import gpc
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 15)
    X = rng.normal(size=(45, 2)) + 3.0 * np.eye(3)[y][:, :2]
    gpc.GaussianProcessClassifier(kernel=1.0 * SkRBF(1.0)).fit(X, y)
    gpc.MultiClassGPC().fit(X, y)
    assert capsys.readouterr().err == ""
    gpc.GaussianProcessClassifier(kernel=1.0 * SkRBF(1.0), verbose=1).fit(X, y)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all("start 1 of 1: log evidence" in line for line in lines)
    # the one-vs-rest problems fit on n_jobs threads: each prints when its start ends, in any order
    assert sorted(line.split(": start")[0] for line in lines) == [
        f"GaussianProcessClassifier {k} vs rest" for k in range(3)]
    gpc.MultiClassGPC(verbose=2).fit(X, y)
    lines = capsys.readouterr().err.splitlines()
    evaluations = [line for line in lines if ": evaluation " in line]
    assert evaluations and lines[-1].startswith("MultiClassGPC('robust'): start 1 of 1")
    assert f"after {len(evaluations)} evaluations" in lines[-1]
