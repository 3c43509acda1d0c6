"""Property-based checks of gpc.exceptions' policy (hypothesis) over infer() and the four
estimators.

Every run either returns a usable result or raises an exception of the policy: ValueError /
TypeError naming the problem for bad input, gpc.exceptions.NumericalError for a numerical failure
on valid input.  On valid input no warning reaches the caller but ConvergenceWarning and EP's
NegativeSitesWarning (NumPy's RuntimeWarning least of all).

- ``infer()``: every method/likelihood/schedule pair on RBF kernels from nearly diagonal to nearly
  singular; a usable result is finite, with log evidence ≤ 0 and non-negative variances.
- GaussianProcessClassifier: 2-3 classes, one-vs-rest and one-vs-one, fixed kernels; probabilities
  in [0, 1] whose rows sum to 1.
- SparseGaussianProcessClassifier, MultiClassGPC and SparseMultiClassGPC (per-row and tied sites):
  random data sets (n up to 40, d 1-5, scales 1e-9 to 1e8, duplicate rows, constant columns,
  int / float32 / Fortran / list input, labels as ints, strings, floats and bools) under every
  parameter, and every kind of bad input, each of which must raise its ValueError / TypeError.  A usable model predicts finite probabilities in
  [0, 1], rows summing to 1, and predict is their argmax.

- Fitted states (every estimator on Gaussian clusters): class-sorted rows against shuffled ones,
  every max_iter from 1 to 10, 1-3 in-process shards under every noise treatment of
  SparseMultiClassGPC, KeyboardInterrupts at random calls of a fit, and predict_proba's peak
  memory at C = 50.  A fitted state has probabilities in [0, 1] summing to 1, a finite log evidence
  (≤ 0 for EP), outlier rates and probabilities in [0, 1]; an interrupted or failed fit leaves such
  a state or none.

CI runs a few hundred derandomised examples in all (about 30 s); ``-m slow`` runs thousands
(``-s`` prints the outcome counts; docs/reliability.md has the last run's).  The slow runs of the
estimators' valid input go on past an example outside the policy and list every one at the end;
each is a test of its own, so ``-k`` can run them apart (in parallel processes).
"""

import collections
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gpc import infer
from gpc.exceptions import ConvergenceWarning, NumericalError
from gpc.inference._sites import NegativeSitesWarning

from helpers import rbf

PAIRS = [("laplace", "probit", None), ("laplace", "logit", None), ("ep", "probit", "sequential"),
         ("ep", "probit", "parallel"), ("ep", "heaviside", "sequential"),
         ("ep", "noisy_threshold", "parallel"), ("pl", "probit", "sequential"),
         ("pl", "noisy_threshold", "parallel"), ("kl", "logit", None), ("kl", "probit", None),
         ("vb", "logit", None), ("vb", "probit", None), ("mf-ensemble", "probit", None),
         ("mf-naive", "probit", None), ("online", "probit", None), ("online", "heaviside", None)]

problems = st.fixed_dictionaries({
    "n": st.integers(2, 12),
    "seed": st.integers(0, 2**16),
    "log_ell": st.floats(np.log(1e-4), np.log(1e4)),
    "log_sf2": st.floats(np.log(1e-4), np.log(1e4)),
    "pair": st.sampled_from(PAIRS),
    "max_iter": st.sampled_from([None, 1, 3]),
})


#: outcomes of the examples run in this session, printed at the end of the module (``-s`` shows them)
OUTCOMES = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def _report_outcomes():
    yield
    if OUTCOMES:
        print("\nfuzz outcomes:", dict(sorted(OUTCOMES.items())))


def _check_one(p):
    rng = np.random.default_rng(p["seed"])
    X = rng.standard_normal((p["n"], 2))
    y = rng.choice([-1.0, 1.0], p["n"])
    K = rbf(X, np.exp(p["log_ell"]), np.exp(p["log_sf2"]))
    method, likelihood, schedule = p["pair"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            r = infer(K, y, likelihood=likelihood, method=method, schedule=schedule,
                      max_iter=p["max_iter"])
        except (ValueError, TypeError, NumericalError) as exc:
            r = exc     # inside the policy (a K that is numerically singular is bad input)
    # labels of one sign are valid input that infer warns about (string classes compared with a
    # number give them)
    one_class = ("one class",) if np.all(y == y[0]) else ()
    _warnings_allowed(caught, (ConvergenceWarning, NegativeSitesWarning), "infer", one_class)
    if isinstance(r, Exception):
        OUTCOMES[type(r).__name__] += 1
        return
    assert np.isfinite(r.log_evidence) and r.log_evidence <= 0.0
    assert np.all(np.isfinite(r.mean))
    var = r.posterior.diag_cov()
    # variances are non-negative up to rounding of K's scale (1e-12 relative to its largest entry)
    assert np.all(np.isfinite(var)) and np.all(var >= -1e-12 * np.max(np.diag(K)))
    OUTCOMES["finite result"] += 1


def _examples(n):
    """Derandomised hypothesis settings for n examples (the same examples in every run)."""
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@_examples(300)   # "a few hundred" in CI (about 5 s)
@given(problems)
def test_infer_obeys_the_exception_policy(p):
    _check_one(p)


@pytest.mark.slow
@_examples(10_000)
@given(problems)
def test_infer_obeys_the_exception_policy_many(p):
    _check_one(p)


estimator_problems = st.fixed_dictionaries({
    "n": st.integers(4, 14),
    "n_classes": st.integers(2, 3),
    "seed": st.integers(0, 2**16),
    "log_ell": st.floats(np.log(1e-4), np.log(1e4)),
    "log_sf2": st.floats(np.log(1e-4), np.log(1e4)),
    "pair": st.sampled_from(PAIRS),
    "multi_class": st.sampled_from(["one_vs_rest", "one_vs_one"]),
    "scale": st.sampled_from([1.0, 1e-3, 1e3]),
})


def _check_estimator(p):
    from gpc import GaussianProcessClassifier
    from gpc.kernels import RBF, ConstantKernel
    rng = np.random.default_rng(p["seed"])
    X = p["scale"] * rng.standard_normal((p["n"], 2))
    y = np.arange(p["n"]) % p["n_classes"]            # every class present
    rng.shuffle(y)
    method, likelihood, schedule = p["pair"]
    kernel = ConstantKernel(np.exp(p["log_sf2"]), "fixed") * RBF(np.exp(p["log_ell"]), "fixed")
    model = GaussianProcessClassifier(kernel, likelihood=likelihood, method=method, schedule=schedule,
                                      optimizer=None, multi_class=p["multi_class"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model.fit(X, y)
            proba = model.predict_proba(rng.standard_normal((5, 2)) * p["scale"])
        except (ValueError, TypeError, NumericalError) as exc:
            proba = exc
    _warnings_allowed(caught, (ConvergenceWarning, NegativeSitesWarning), "estimator")
    if isinstance(proba, Exception):
        OUTCOMES["estimator " + type(proba).__name__] += 1
        return
    assert np.all(np.isfinite(proba)) and np.all((proba >= 0.0) & (proba <= 1.0))
    # rows sum to one up to the rounding of a normalisation over ≤ 3 classes
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    assert all(np.isfinite(b.result_.log_evidence) and b.result_.log_evidence <= 0.0
               for b in model.base_estimators_)
    OUTCOMES["estimator finite result"] += 1


@_examples(100)
@given(estimator_problems)
def test_estimator_obeys_the_exception_policy(p):
    _check_estimator(p)


@pytest.mark.slow
@_examples(2_000)
@given(estimator_problems)
def test_estimator_obeys_the_exception_policy_many(p):
    _check_estimator(p)


# -- the sparse and the multi-class estimators ------------------------------------------------------
#
# Each example draws a data set (shape, scale, duplicate rows, constant columns, the container and
# dtype of X, the type of the labels) and a full set of the estimator's parameters, or one piece of
# bad input.  Valid input ends in a usable model (``_check_model``) or a NumericalError; bad input in
# the ValueError / TypeError that names it.  On valid input the only warnings that may reach the
# caller are the documented ones: ConvergenceWarning (an iteration or optimiser budget ran out)
# and, from EP's negative-site policies, NegativeSitesWarning.  Any other category, NumPy's
# RuntimeWarning ("overflow in exp", "invalid value in divide") first of all, fails the example.

#: the data's parts that an example varies
data_problems = {
    "seed": st.integers(0, 2**16),
    "d": st.integers(1, 5),
    "log10_scale": st.floats(-9.0, 8.0),
    "columns": st.sampled_from(["same scale", "scales 1e±3 apart", "offset 1e4 scales"]),
    "duplicates": st.sampled_from(["none", "some", "all rows equal"]),
    "constant_columns": st.integers(0, 2),
    "container": st.sampled_from(["float64", "float32", "int", "fortran", "list"]),
    "labels": st.sampled_from(["int", "str", "bool", "float", "sparse ints"]),
}


def _make_data(p, n, n_classes, n_test=6):
    """(X, y, X_test, the y's distinct labels) for example p: n training rows with every one of
    n_classes classes present, and n_test test rows from the same distribution (the first a
    training row, the second a million times as far from the origin as the data)."""
    rng = np.random.default_rng(p["seed"])
    d = p["d"]
    Z = rng.standard_normal((n + n_test, d))
    scale = 10.0 ** p["log10_scale"]
    if p["columns"] == "same scale":
        Z *= scale
    elif p["columns"] == "scales 1e±3 apart":
        Z *= scale * 10.0 ** rng.uniform(-3.0, 3.0, d)
    else:     # far from the origin: distances are small differences of large numbers
        Z = scale * (1e4 + Z)
    if p["duplicates"] == "some" and n > 1:
        src = rng.integers(0, n, size=max(1, n // 3))
        Z[rng.integers(0, n, size=len(src))] = Z[src]
    elif p["duplicates"] == "all rows equal":
        Z[:] = Z[0]
    for j in rng.choice(d, size=min(d, p["constant_columns"]), replace=False):
        Z[:, j] = scale * rng.standard_normal()
    Z[n] = Z[0]                     # a test row equal to a training row,
    Z[n + 1] *= 1e6                 # and one far from every training row
    index = np.arange(n) % n_classes
    rng.shuffle(index)
    kind = p["labels"] if p["labels"] != "bool" or n_classes == 2 else "int"
    values = {"int": np.arange(n_classes), "str": np.array([f"class {k}" for k in range(n_classes)]),
              "bool": np.array([False, True]), "float": np.arange(n_classes) + 1.0,
              "sparse ints": np.array([-7, 0, 3, 11, 100, 10**6])[:n_classes]}[kind]
    y = values[index]
    X, X_test = _container(Z[:n], p["container"]), _container(Z[n:], p["container"])
    return X, y, X_test, np.unique(y)


def _container(Z, how):
    if how == "float32":
        return Z.astype(np.float32)
    if how == "int":
        return np.round(Z).astype(np.int64)
    if how == "fortran":
        return np.asfortranarray(Z)
    if how == "list":
        return Z.tolist()
    return Z


def _warnings_allowed(caught, allowed, estimator, expected=()):
    """Count the warnings of an example; fail on any category outside ``allowed`` but the
    UserWarnings that the example's input must give (``expected``: patterns of their messages,
    e.g. one class of labels), and fail if one of those is missing."""
    import re

    def announced(w):
        return issubclass(w.category, UserWarning) and any(re.search(pattern, str(w.message))
                                                           for pattern in expected)

    for w in caught:
        OUTCOMES[f"{estimator} warning {w.category.__name__}"] += 1
    stray = [w for w in caught if not issubclass(w.category, allowed) and not announced(w)]
    assert not stray, "warnings outside the policy: " + "; ".join(
        f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in stray)
    for pattern in expected:
        assert any(re.search(pattern, str(w.message)) for w in caught), (
            f"no warning matching {pattern!r}")


def _check_model(model, X_test, classes):
    """A fitted classifier's predictions: probabilities finite, in [0, 1], rows summing to 1, and
    predict the argmax of predict_proba."""
    assert np.array_equal(model.classes_, classes)
    proba = model.predict_proba(X_test)
    assert proba.shape == (len(X_test), len(classes))
    assert np.all(np.isfinite(proba)) and np.all((proba >= 0.0) & (proba <= 1.0))
    # a normalised row of ≤ 6 non-negative terms sums to 1 within a few ulp (each addition and
    # the division round by at most 2⁻⁵³ relative): 1e-12 is ample and still catches any lost mass
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0.0, atol=1e-12)
    predicted = model.predict(X_test)
    assert np.array_equal(predicted, classes[np.argmax(proba, axis=1)])
    return proba


def _run(estimator, allowed_warnings, fit_and_check, variant, expected=()):
    """Run one valid example: a usable model or a NumericalError, and no stray warning.  Counts
    the example, and its outcome once it is known to be inside the policy (a NumericalError with
    ``variant``, the method or model)."""
    OUTCOMES[f"{estimator} examples"] += 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fit_and_check()
        except NumericalError as exc:
            outcome = f"{type(exc).__name__} ({variant})"
        else:
            outcome = "usable result"
    _warnings_allowed(caught, allowed_warnings, estimator, expected)
    OUTCOMES[f"{estimator} {outcome}"] += 1


def _expect_bad(estimator, call, exc, match):
    """Run one piece of bad input: it raises ``exc`` with a message matching ``match``, and warns
    nothing on the way."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(exc, match=match) as info:
            call()
    _warnings_allowed(caught, (), estimator)
    OUTCOMES[f"{estimator} bad input {type(info.value).__name__}"] += 1


#: kinds of bad data, shared by both estimators (:func:`_bad_data` makes each)
BAD_DATA = ["NaN in X", "inf in X", "X 1-D", "X 3-D", "y too short", "y 2-D", "one class", "no rows",
            "complex X", "X of strings", "y continuous", "NaN in y", "sparse X", "one row",
            "predict: other features", "predict: NaN", "predict: 1-D X", "predict: no rows",
            "predict before fit"]


def _fitter(make, X, y):
    """A function that fits a fresh estimator to (X, y), its ConvergenceWarnings silenced: the
    setup of a piece of bad input at predict or partial_fit."""
    def fitted():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return make().fit(X, y)
    return fitted


def _bad_data(kind, make, X, y, X_test):
    """(call, exception, pattern) for one kind of bad data; ``make()`` is a fresh estimator."""
    X = np.asarray(X, dtype=np.float64)
    Xt = np.asarray(X_test, dtype=np.float64)
    if kind == "NaN in X":
        X = X.copy()
        X[len(X) // 2, -1] = np.nan
        return (lambda: make().fit(X, y)), ValueError, "NaN"
    if kind == "inf in X":
        X = X.copy()
        X[0, 0] = -np.inf
        return (lambda: make().fit(X, y)), ValueError, "inf"
    if kind == "X 1-D":
        return (lambda: make().fit(X[:, 0], y)), ValueError, "2D"
    if kind == "X 3-D":
        return (lambda: make().fit(X[:, :, None], y)), ValueError, "2D"
    if kind == "y too short":
        return (lambda: make().fit(X, y[:-1])), ValueError, "samples"
    if kind == "y 2-D":
        return (lambda: make().fit(X, np.column_stack([y, y]))), ValueError, "1d"
    if kind == "one class":
        return (lambda: make().fit(X, np.full(len(y), y[0]))), ValueError, "one class"
    if kind == "no rows":
        return (lambda: make().fit(X[:0], y[:0])), ValueError, "0 sample"
    if kind == "complex X":
        return (lambda: make().fit(X + 1j, y)), ValueError, "[Cc]omplex"
    if kind == "X of strings":
        return (lambda: make().fit(np.full(X.shape, "a"), y)), ValueError, "numeric"
    if kind == "y continuous":
        return (lambda: make().fit(X, np.linspace(0.1, 0.9, len(y)))), ValueError, "continuous"
    if kind == "NaN in y":
        yn = np.arange(len(y), dtype=float) % 2
        yn[-1] = np.nan
        return (lambda: make().fit(X, yn)), ValueError, "NaN"
    if kind == "sparse X":
        from scipy import sparse
        return (lambda: make().fit(sparse.csr_matrix(X), y)), TypeError, "sparse"
    if kind == "one row":
        return (lambda: make().fit(X[:1], y[:1])), ValueError, "one class"
    if kind == "predict before fit":
        from gpc._estimator import NotFittedError
        return (lambda: make().predict_proba(Xt)), NotFittedError, "not fitted"

    fitted = _fitter(make, X, y)
    if kind == "predict: other features":
        wider = np.column_stack([Xt, Xt[:, :1]])
        return (lambda: fitted().predict(wider)), ValueError, "features"
    if kind == "predict: NaN":
        Xn = Xt.copy()
        Xn[-1, 0] = np.nan
        return (lambda: fitted().predict_proba(Xn)), ValueError, "NaN"
    if kind == "predict: 1-D X":
        return (lambda: fitted().predict(Xt[0])), ValueError, "2D"
    if kind == "predict: no rows":
        return (lambda: fitted().predict_proba(Xt[:0])), ValueError, "0 sample"
    raise AssertionError(kind)


def _survey(estimator, problems, check, n):
    """n derandomised examples of ``check`` that go on past an example outside the policy (it is
    counted and kept) and fail at the end, listing them: the slow runs report every failure and
    complete counts, where a plain @given stops at the first and shrinks it."""
    failures = []

    @_examples(n)
    @given(problems)
    def run(p):
        try:
            check(p)
        except (Exception, pytest.fail.Exception) as exc:
            OUTCOMES[f"{estimator} OUTSIDE THE POLICY"] += 1
            failures.append(f"{type(exc).__name__}: {str(exc)[:300]}\n    example: {p}")

    run()
    assert not failures, f"{len(failures)} examples outside the policy:\n" + "\n".join(failures)


def _log_uniform(lo, hi):
    return st.floats(np.log(lo), np.log(hi)).map(np.exp)


# -- SparseGaussianProcessClassifier ---------------------------------------------------------------

sparse_problems = st.fixed_dictionaries({
    **data_problems,
    "n": st.integers(2, 40),
    "n_classes": st.integers(2, 3),
    "method": st.sampled_from(["ep", "pl", "gfitc", "svi"]),
    "likelihood": st.sampled_from(["probit", "logit", "noisy_threshold"]),
    "on_negative": st.sampled_from(["keep", "keep-skip", "clip", "skip", "pl", "raise"]),
    "batch_size": st.one_of(st.none(), st.just("auto"), st.integers(1, 45)),
    "max_iter": st.integers(1, 4),
    "tied_sites": st.booleans(),
    "optimize_inducing": st.booleans(),
    "inducing_points": st.sampled_from(["kmeans", "random", "array"]),
    "n_inducing": st.integers(1, 8),
    "learning_rate": _log_uniform(1e-3, 10.0),
    "damping": st.one_of(st.none(), st.floats(0.05, 1.0)),
    "jitter": st.sampled_from([0.0, 1e-8, 1e-4]),
    "validation": st.booleans(),
    "n_jobs": st.sampled_from([None, 1, 2, -1]),
    "random_state": st.one_of(st.none(), st.integers(0, 2**16)),
    "fit": st.sampled_from(["fit", "fit, partial_fit", "partial_fit"]),
    "kernel": st.sampled_from(["default", "C * RBF(1)", "fixed RBF at the data's scale"]),
})

#: bad parameters of the sparse estimator: (parameter, value, pattern of the message)
SPARSE_BAD_PARAMS = [
    ("method", "sep", "method"), ("likelihood", "bogus", "likelihood"),
    ("on_negative", "ignore", "on_negative"), ("batch_size", 0, "batch_size"),
    ("batch_size", 2.5, "batch_size"), ("batch_size", "all", "batch_size"),
    ("batch_size", True, "batch_size"), ("max_iter", 0, "max_iter"), ("max_iter", 1.5, "max_iter"),
    ("max_iter", "forever", "max_iter"), ("max_iter", True, "max_iter"),
    ("learning_rate", 0.0, "learning_rate"), ("learning_rate", np.nan, "learning_rate"),
    ("damping", 0.0, "damping"), ("damping", 1.5, "damping"), ("damping", np.nan, "damping"),
    ("jitter", -1e-8, "jitter"), ("jitter", np.inf, "jitter"), ("n_inducing", 0, "n_inducing"),
    ("n_inducing", 2.5, "n_inducing"), ("inducing_points", "grid", "inducing_points"),
    ("inducing_points", "wrong shape", "inducing_points"),
    ("inducing_points", "NaN", "inducing_points"), ("tied_sites", "with method='pl'", "tied_sites"),
    ("batch_size", "5 with method='gfitc'", "batch"),
    ("n_jobs", 0, "n_jobs"), ("n_jobs", 1.5, "n_jobs"), ("random_state", "seed", "random_state"),
    ("validation_data", "one array", "validation_data"),
    ("validation_data", "other features", "validation_data"),
    ("validation_data", "NaN", "validation_data"),
    ("validation_data", "labels outside the classes", "validation_data"),
    ("kernel", "start outside its bounds", "bounds"),
]

SPARSE_BAD_FIT = ["partial_fit: unseen label", "partial_fit: other classes",
                  "partial_fit: other rows", "partial_fit: one class first"]

sparse_bad_problems = st.fixed_dictionaries({
    **data_problems,
    "n": st.integers(4, 20),
    "n_classes": st.integers(2, 3),
    "method": st.sampled_from(["ep", "pl", "gfitc", "svi"]),
})

#: every kind of bad input of the sparse estimator (each test runs all of them)
SPARSE_BAD = BAD_DATA + SPARSE_BAD_FIT + [f"{name}={value!r}" for name, value, _ in SPARSE_BAD_PARAMS]

def _sparse_kernel(which, X):
    from gpc.kernels import RBF, ConstantKernel
    if which == "default":
        return None
    if which == "C * RBF(1)":
        return ConstantKernel(1.0) * RBF(1.0)
    spread = float(np.std(np.asarray(X, dtype=np.float64)))
    return ConstantKernel(1.0, "fixed") * RBF(spread if spread > 0 else 1.0, "fixed")


def _sparse_params(p, X):
    """The estimator's parameters for example p (valid ones: tied sites only with EP, GFITC in
    batch)."""
    method = p["method"]
    batch = p["batch_size"] if method != "gfitc" or not isinstance(p["batch_size"], int) else None
    params = dict(method=method, likelihood=p["likelihood"], on_negative=p["on_negative"],
                  batch_size=batch, max_iter=p["max_iter"],
                  tied_sites=p["tied_sites"] and method == "ep",
                  optimize_inducing=p["optimize_inducing"], n_inducing=p["n_inducing"],
                  learning_rate=p["learning_rate"], damping=p["damping"], jitter=p["jitter"],
                  n_jobs=p["n_jobs"], random_state=p["random_state"], progress=False,
                  kernel=_sparse_kernel(p["kernel"], X))
    if p["inducing_points"] == "array":
        rng = np.random.default_rng(p["seed"] + 1)
        Xf = np.asarray(X, dtype=np.float64)
        # training rows (duplicates possible) moved by a tenth of the columns' spread
        rows = Xf[rng.integers(0, len(Xf), size=p["n_inducing"])]
        params["inducing_points"] = rows + 0.1 * rng.standard_normal(rows.shape) * Xf.std(axis=0)
    else:
        params["inducing_points"] = p["inducing_points"]
    return params


def _check_sparse(p):
    from gpc import SparseGaussianProcessClassifier
    X, y, X_test, classes = _make_data(p, p["n"], p["n_classes"])
    params = _sparse_params(p, X)
    if p["validation"]:
        params["validation_data"] = (X_test, y[:len(X_test)] if len(y) >= len(X_test)
                                     else np.resize(y, len(X_test)))
    model = SparseGaussianProcessClassifier(**params)

    def fit_and_check():
        _fit_sparse(model, p, X, y, classes, params["tied_sites"])
        _check_sparse_fit(model, p, X_test, classes)

    allowed = (ConvergenceWarning, NegativeSitesWarning)
    # more inducing points than rows: n of them are used, with scikit-learn's Nystroem's warning
    too_many = p["inducing_points"] != "array" and p["n_inducing"] > p["n"]
    _run("sparse", allowed, fit_and_check, p["method"],
         ("is more than the",) if too_many else ())


def _fit_sparse(model, p, X, y, classes, tied_sites):
    """``fit``, ``fit`` then ``partial_fit``, or ``partial_fit(classes=...)`` on the unfitted
    model, as example p says (both sparse estimators)."""
    if p["fit"] == "partial_fit":
        model.partial_fit(X, y, classes=classes)
    else:
        model.fit(X, y)
    if p["fit"] == "fit, partial_fit" and tied_sites:
        model.partial_fit(X[::2], y[::2])      # tied sites take any rows: a stream
    elif p["fit"] == "fit, partial_fit":
        model.partial_fit(X, y)


def _check_sparse_fit(model, p, X_test, classes):
    """A usable sparse fit (both sparse estimators): _check_model, a finite history (and
    validation scores) and finite latent moments with variances ≥ 0; returns them."""
    _check_model(model, X_test, classes)
    assert len(model.history_) == model.n_iter_ >= 1
    assert np.isfinite(model.log_marginal_likelihood_value_)
    for entry in model.history_:
        assert np.isfinite(entry["objective"])
        if p["validation"]:
            assert 0.0 <= entry["val_error"] <= 1.0 and np.isfinite(entry["val_nll"])
            assert entry["val_nll"] >= 0.0
    mean, var = model.predict_latent(X_test)
    assert mean.shape == var.shape and len(mean) == len(X_test)
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(var)) and np.all(var >= 0.0)
    return mean, var


def _check_sparse_bad(p, kind):
    from gpc import SparseGaussianProcessClassifier
    X, y, X_test, classes = _make_data(p, p["n"], p["n_classes"])
    base = dict(method=p["method"], max_iter=1, n_inducing=3, progress=False, random_state=0)
    make = lambda **kw: SparseGaussianProcessClassifier(**{**base, **kw})   # noqa: E731
    if kind in BAD_DATA:
        call, exc, match = _bad_data(kind, make, X, y, X_test)
    elif kind in SPARSE_BAD_FIT:
        call, exc, match = _sparse_bad_fit(kind, make, X, y, classes)
    else:
        name, value, match = SPARSE_BAD_PARAMS[SPARSE_BAD.index(kind) - len(BAD_DATA)
                                               - len(SPARSE_BAD_FIT)]
        value, extra = _sparse_bad_value(name, value, X, y, p["method"])
        call, exc = (lambda: make(**{name: value, **extra}).fit(X, y)), ValueError
    _expect_bad("sparse", call, exc, match)


def _sparse_bad_value(name, value, X, y, method):
    """The bad value itself, and other parameters that it needs, for SPARSE_BAD_PARAMS."""
    from gpc.kernels import RBF
    d = np.asarray(X).shape[1]
    if name == "inducing_points" and value == "wrong shape":
        return np.zeros((3, d + 1)), {}
    if name == "inducing_points" and value == "NaN":
        return np.full((3, d), np.nan), {}
    if name == "tied_sites":
        return True, {"method": "pl"}
    if name == "batch_size" and isinstance(value, str) and "gfitc" in value:
        return 5, {"method": "gfitc"}
    if name == "validation_data":
        Xv = np.asarray(X, dtype=np.float64)
        if value == "one array":
            return (Xv,), {}
        if value == "other features":
            return (np.column_stack([Xv, Xv]), y), {}
        if value == "labels outside the classes":
            return (Xv, np.full(len(y), "unseen label")), {}
        Xv = Xv.copy()
        Xv[0, 0] = np.nan
        return (Xv, y), {}
    if name == "kernel":
        return RBF(1.0, length_scale_bounds=(10.0, 100.0)), {}
    if name == "batch_size" and method == "gfitc":
        return value, {"method": "ep"}            # the size itself is the problem here
    return value, {}


def _sparse_bad_fit(kind, make, X, y, classes):
    """partial_fit misuse: (call, exception, pattern)."""
    fitted = _fitter(make, X, y)
    if kind == "partial_fit: unseen label":
        other = np.array(["never seen"] * len(y)) if classes.dtype.kind == "U" else np.full(len(y), 99)
        return (lambda: fitted().partial_fit(X, other)), ValueError, "not in classes_"
    if kind == "partial_fit: other classes":
        wrong = np.append(classes, "extra" if classes.dtype.kind == "U" else 12345)
        return (lambda: fitted().partial_fit(X, y, classes=wrong)), ValueError, "classes"
    if kind == "partial_fit: other rows":
        Xa = np.asarray(X, dtype=np.float64)
        return (lambda: fitted().partial_fit(Xa[:-1], y[:-1])), ValueError, "rows"
    return (lambda: make().partial_fit(X, np.full(len(y), y[0]))), ValueError, "two classes"


@_examples(60)    # derandomised: about a second in CI
@given(sparse_problems)
def test_sparse_estimator_obeys_the_exception_policy(p):
    _check_sparse(p)


@pytest.mark.parametrize("kind", SPARSE_BAD)
@_examples(2)
@given(sparse_bad_problems)
def test_sparse_estimator_rejects_bad_input(kind, p):
    _check_sparse_bad(p, kind)


@pytest.mark.slow
def test_sparse_estimator_obeys_the_exception_policy_many():
    _survey("sparse", sparse_problems, _check_sparse, 3000)


@pytest.mark.slow
@pytest.mark.parametrize("kind", SPARSE_BAD)
@_examples(25)
@given(sparse_bad_problems)
def test_sparse_estimator_rejects_bad_input_many(kind, p):
    _check_sparse_bad(p, kind)


# -- MultiClassGPC ---------------------------------------------------------------------------------

def _small_lbfgsb(obj_func, initial_theta, bounds):
    """gpc's L-BFGS-B (the default optimizer) held to 2 iterations and 4 evaluations."""
    from gpc.optimize import lbfgsb
    return lbfgsb(obj_func, initial_theta, bounds, maxiter=2, maxfun=4)


multiclass_problems = st.fixed_dictionaries({
    **data_problems,
    "n": st.integers(2, 40),
    "n_classes": st.integers(2, 6),
    "model": st.sampled_from(["robust", "standard", "heavy-tailed"]),
    "label_noise": st.one_of(st.just("beta"), st.floats(0.01, 0.95)),   # ε as a share of (l − 1)/l
    "learn_label_noise": st.booleans(),
    "shared_kernel": st.booleans(),
    "optimizer": st.sampled_from([None, "L-BFGS-B, 4 evaluations"]),
    "n_restarts_optimizer": st.sampled_from([0, 0, 1]),
    "max_iter": st.integers(1, 30),
    "tol": _log_uniform(1e-8, 0.5),
    "a0": _log_uniform(1e-2, 1e3),
    "b0": _log_uniform(1e-2, 1e3),
    "n_jobs": st.sampled_from([None, 1, 2, -1]),
    "random_state": st.one_of(st.none(), st.integers(0, 2**16)),
    "kernel": st.sampled_from(["default", "RBF(1)", "C * RBF(1)", "fixed RBF at the data's scale"]),
})


def _multiclass_params(p, X, n_classes):
    """The estimator's parameters for example p (valid ones: HTPC with a shared kernel, ε only for
    the robust model, below (l − 1)/l and inside its bounds when learnt)."""
    from gpc.kernels import RBF, ConstantKernel
    model = p["model"]
    params = dict(model=model, shared_kernel=p["shared_kernel"] or model == "heavy-tailed",
                  optimizer=None if p["optimizer"] is None else _small_lbfgsb,
                  n_restarts_optimizer=p["n_restarts_optimizer"], max_iter=p["max_iter"],
                  tol=p["tol"], a0=p["a0"], b0=p["b0"], n_jobs=p["n_jobs"],
                  random_state=p["random_state"])
    if model == "robust" and p["label_noise"] != "beta":
        top = (n_classes - 1) / n_classes
        if p["learn_label_noise"]:      # a start inside the default bounds (1e-6, 0.4)
            params["label_noise"] = min(p["label_noise"] * top, 0.4)
        else:
            params["label_noise"], params["label_noise_bounds"] = p["label_noise"] * top, "fixed"
    spread = float(np.std(np.asarray(X, dtype=np.float64)))
    params["kernel"] = {"default": None, "RBF(1)": RBF(1.0),
                        "C * RBF(1)": ConstantKernel(1.0) * RBF(1.0),
                        "fixed RBF at the data's scale": RBF(spread if spread > 0 else 1.0, "fixed"),
                        }[p["kernel"]]
    return params


def _check_multiclass(p):
    from gpc import MultiClassGPC
    n_classes = min(p["n_classes"], p["n"])
    X, y, X_test, classes = _make_data(p, p["n"], n_classes)
    model = MultiClassGPC(**_multiclass_params(p, X, n_classes))

    def fit_and_check():
        model.fit(X, y)
        _check_model(model, X_test, classes)
        assert model.n_classes_ == n_classes and model.n_iter_ >= 0
        assert np.isfinite(model.log_marginal_likelihood_value_)
        rho = model.outlier_probability_
        assert rho.shape == (len(y),) and np.all((rho >= 0.0) & (rho <= 1.0))
        if model.label_noise_ is not None:
            assert 0.0 < model.label_noise_ < (n_classes - 1) / n_classes

    _run("multiclass", (ConvergenceWarning,), fit_and_check, p["model"])


MULTICLASS_BAD_PARAMS = [
    ("model", "bogus", "model"), ("shared_kernel", "False with model='heavy-tailed'", "shared_kernel"),
    ("a0", 0.0, "a0"), ("a0", -1.0, "a0"), ("b0", np.nan, "b0"), ("b0", np.inf, "b0"),
    ("max_iter", 0, "max_iter"), ("max_iter", 2.5, "max_iter"), ("max_iter", True, "max_iter"),
    ("tol", 0.0, "tol"),
    ("tol", np.nan, "tol"), ("n_restarts_optimizer", -1, "n_restarts_optimizer"),
    ("n_jobs", 0, "n_jobs"), ("n_jobs", "all", "n_jobs"), ("label_noise", "gamma", "label_noise"),
    ("label_noise", -0.1, "label_noise"), ("label_noise", 1.0, "label_noise"),
    ("label_noise", "(l - 1)/l", "label_noise"),
    ("label_noise", "0.1 with model='standard'", "label_noise"),
    ("label_noise_bounds", (0.3, 0.1), "label_noise_bounds"),
    ("label_noise_bounds", "free", "label_noise_bounds"),
    ("label_noise_bounds", (0.0, 0.3), "label_noise_bounds"),
    ("optimizer", "bogus", "optimizer"), ("optimizer", "bogus with a fixed kernel", "optimizer"),
    ("random_state", "seed", "random_state"),
]

multiclass_bad_problems = st.fixed_dictionaries({
    **data_problems,
    "n": st.integers(4, 20),
    "n_classes": st.integers(2, 4),
    "model": st.sampled_from(["robust", "standard", "heavy-tailed"]),
})

#: every kind of bad input of the multi-class estimator
MULTICLASS_BAD = BAD_DATA + [f"{name}={value!r}" for name, value, _ in MULTICLASS_BAD_PARAMS]


def _multiclass_bad_value(name, value, n_classes):
    """The bad value itself, and other parameters that it needs, for MULTICLASS_BAD_PARAMS."""
    if name == "shared_kernel":
        return False, {"model": "heavy-tailed"}
    if name == "optimizer" and value != "bogus":    # nothing to optimise: still a bad value
        from gpc.kernels import RBF
        return "bogus", {"kernel": RBF(1.0, "fixed")}
    if name == "label_noise" and value == "(l - 1)/l":
        return (n_classes - 1) / n_classes, {"model": "robust", "label_noise_bounds": "fixed"}
    if name == "label_noise" and isinstance(value, str) and "standard" in value:
        return 0.1, {"model": "standard"}
    if name == "label_noise":
        return value, {"model": "robust"}
    if name == "label_noise_bounds":
        return value, {"model": "robust", "label_noise": 0.1}
    return value, {}


def _check_multiclass_bad(p, kind):
    from gpc import MultiClassGPC
    from gpc.kernels import RBF
    X, y, X_test, classes = _make_data(p, p["n"], p["n_classes"])
    # a given kernel and no optimizer: nothing draws on random_state or runs the optimizer, so
    # only the parameter check can find a bad one
    base = dict(model=p["model"], kernel=RBF(1.0), optimizer=None, max_iter=3)
    make = lambda **kw: MultiClassGPC(**{**base, **kw})   # noqa: E731
    if kind in BAD_DATA:
        call, exc, match = _bad_data(kind, make, X, y, X_test)
    else:
        name, value, match = MULTICLASS_BAD_PARAMS[MULTICLASS_BAD.index(kind) - len(BAD_DATA)]
        value, extra = _multiclass_bad_value(name, value, p["n_classes"])
        call, exc = (lambda: make(**{**extra, name: value}).fit(X, y)), ValueError
    _expect_bad("multiclass", call, exc, match)


@_examples(30)    # derandomised: about 10 s in CI
@given(multiclass_problems)
def test_multiclass_estimator_obeys_the_exception_policy(p):
    _check_multiclass(p)


@pytest.mark.parametrize("kind", MULTICLASS_BAD)
@_examples(2)
@given(multiclass_bad_problems)
def test_multiclass_estimator_rejects_bad_input(kind, p):
    _check_multiclass_bad(p, kind)


@pytest.mark.slow
def test_multiclass_estimator_obeys_the_exception_policy_many():
    _survey("multiclass", multiclass_problems, _check_multiclass, 1000)


@pytest.mark.slow
@pytest.mark.parametrize("kind", MULTICLASS_BAD)
@_examples(25)
@given(multiclass_bad_problems)
def test_multiclass_estimator_rejects_bad_input_many(kind, p):
    _check_multiclass_bad(p, kind)


# -- SparseMultiClassGPC ---------------------------------------------------------------------------

def _sparse_multiclass_problems(tied_sites):
    """The valid input of the sparse multi-class estimator, with per-row or tied sites (tied only
    where they apply: label_noise=ε or model="standard")."""
    return st.fixed_dictionaries({**_SPARSE_MULTICLASS, "tied_sites": st.just(tied_sites)})


_SPARSE_MULTICLASS = {
    **data_problems,
    "n": st.integers(2, 40),
    "n_classes": st.integers(2, 5),
    "model": st.sampled_from(["robust", "standard"]),
    "label_noise": st.one_of(st.just("beta"), st.floats(0.01, 0.95)),   # ε as a share of (l − 1)/l
    "learn_label_noise": st.booleans(),
    "a0": _log_uniform(1e-2, 1e3),
    "b0": _log_uniform(1e-2, 1e3),
    "shared_kernel": st.booleans(),
    "shared_inducing": st.booleans(),
    "batch_size": st.one_of(st.none(), st.just("auto"), st.integers(1, 45)),
    "max_iter": st.integers(1, 4),
    "learning_rate": _log_uniform(1e-3, 10.0),
    "damping": st.one_of(st.none(), st.floats(0.05, 1.0)),
    "optimize_inducing": st.booleans(),
    "inducing_points": st.sampled_from(["kmeans", "random", "array"]),
    "n_inducing": st.integers(1, 8),
    "jitter": st.sampled_from([0.0, 1e-8, 1e-4]),
    "validation": st.booleans(),
    "n_jobs": st.sampled_from([None, 1, 2, -1]),
    "random_state": st.one_of(st.none(), st.integers(0, 2**16)),
    "fit": st.sampled_from(["fit", "fit, partial_fit", "partial_fit"]),
    "kernel": st.sampled_from(["default", "C * RBF(1)", "fixed RBF at the data's scale",
                               "a list, one per class"]),
}


def _sparse_multiclass_params(p, X, n_classes):
    """The estimator's parameters for example p (valid ones: ε only for the robust model, below
    (l − 1)/l and inside its bounds when learnt; tied sites only without the Beta treatment; m at
    most n for "kmeans" and "random")."""
    from gpc.kernels import RBF, ConstantKernel
    model = p["model"]
    if p["tied_sites"] and model == "robust" and p["label_noise"] == "beta":
        p = {**p, "label_noise": 0.1}       # tied sites need ε (or model="standard")
    params = dict(model=model, a0=p["a0"], b0=p["b0"], shared_kernel=p["shared_kernel"],
                  shared_inducing=p["shared_inducing"], batch_size=p["batch_size"],
                  max_iter=p["max_iter"], learning_rate=p["learning_rate"], damping=p["damping"],
                  optimize_inducing=p["optimize_inducing"], n_inducing=p["n_inducing"],
                  jitter=p["jitter"], n_jobs=p["n_jobs"], random_state=p["random_state"],
                  progress=False)
    if model == "robust" and p["label_noise"] != "beta":
        top = (n_classes - 1) / n_classes
        if p["learn_label_noise"]:      # a start inside the default bounds (1e-6, 0.4)
            params["label_noise"] = min(p["label_noise"] * top, 0.4)
        else:
            params["label_noise"], params["label_noise_bounds"] = p["label_noise"] * top, "fixed"
    params["tied_sites"] = p["tied_sites"] and (model == "standard" or "label_noise" in params)
    Xf = np.asarray(X, dtype=np.float64)
    if p["inducing_points"] == "array":
        rng = np.random.default_rng(p["seed"] + 1)
        rows = Xf[rng.integers(0, len(Xf), size=p["n_inducing"])]
        params["inducing_points"] = rows + 0.1 * rng.standard_normal(rows.shape) * Xf.std(axis=0)
    else:
        params["inducing_points"] = p["inducing_points"]
        params["n_inducing"] = min(p["n_inducing"], len(Xf))
    spread = float(np.std(Xf))
    kernel = p["kernel"]
    if kernel == "a list, one per class":
        params["shared_kernel"] = False
        params["kernel"] = [ConstantKernel(1.0) * RBF(1.0 + k) for k in range(n_classes)]
    else:
        params["kernel"] = _sparse_kernel(kernel, X)
    if kernel == "fixed RBF at the data's scale" and spread == 0:
        params["kernel"] = RBF(1.0, "fixed")
    return params


def _check_sparse_multiclass(p):
    from gpc import SparseMultiClassGPC
    n_classes = min(p["n_classes"], p["n"])
    X, y, X_test, classes = _make_data(p, p["n"], n_classes)
    params = _sparse_multiclass_params(p, X, n_classes)
    if p["validation"]:
        params["validation_data"] = (X_test, np.resize(y, len(X_test)))
    model = SparseMultiClassGPC(**params)

    def fit_and_check():
        _fit_sparse(model, p, X, y, classes, params["tied_sites"])
        mean, _ = _check_sparse_fit(model, p, X_test, classes)
        assert mean.shape == (len(X_test), n_classes)
        assert 0.0 <= model.outlier_rate_ <= 1.0
        if model.label_noise_ is not None:
            assert 0.0 < model.label_noise_ < (n_classes - 1) / n_classes
        rho = (model.outlier_probability(X, y) if params["tied_sites"]
               else model.outlier_probability_)
        assert rho.shape == (len(y),) and np.all((rho >= 0.0) & (rho <= 1.0))
        if p["model"] == "standard":
            assert np.all(rho == 0.0) and model.outlier_rate_ == 0.0
        assert len(model.kernels_) == n_classes

    _run("sparse multiclass" + (", tied sites" if params["tied_sites"] else ""),
         (ConvergenceWarning,), fit_and_check, p["model"])


#: bad parameters of the sparse multi-class estimator: (parameter, value, pattern of the message)
SPARSE_MULTICLASS_BAD_PARAMS = [
    ("model", "heavy-tailed", "model"), ("shared_kernel", "no", "shared_kernel"),
    ("shared_inducing", 1, "shared_inducing"), ("optimize_inducing", None, "optimize_inducing"),
    ("tied_sites", "yes", "tied_sites"), ("n_inducing", 0, "n_inducing"),
    ("n_inducing", 2.5, "n_inducing"),
    ("inducing_points", "grid", "inducing_points"),
    ("inducing_points", "wrong shape", "inducing_points"),
    ("inducing_points", "NaN", "inducing_points"),
    ("batch_size", 0, "batch_size"), ("batch_size", "all", "batch_size"),
    ("batch_size", True, "batch_size"), ("max_iter", 0, "max_iter"), ("max_iter", 1.5, "max_iter"),
    ("max_iter", True, "max_iter"), ("learning_rate", 0.0, "learning_rate"),
    ("learning_rate", np.nan, "learning_rate"), ("damping", 0.0, "damping"),
    ("damping", 1.5, "damping"), ("jitter", -1e-8, "jitter"), ("jitter", np.inf, "jitter"),
    ("a0", 0.0, "a0"), ("b0", np.inf, "b0"), ("label_noise", "gamma", "label_noise"),
    ("label_noise", -0.1, "label_noise"), ("label_noise", "(l - 1)/l", "label_noise"),
    ("label_noise", "0.1 with model='standard'", "label_noise"),
    ("label_noise", "0.3 outside learnt bounds (1e-6, 0.2)", "label_noise"),
    ("label_noise_bounds", (0.3, 0.1), "label_noise_bounds"),
    ("label_noise_bounds", "free", "label_noise_bounds"),
    ("tied_sites", "with label_noise='beta'", "tied_sites"),
    ("shared_kernel", "True with a list of kernels", "shared_kernel"),
    ("kernel", "a list of the wrong length", "kernel"),
    ("kernel", "start outside its bounds", "bounds"),
    ("n_jobs", 0, "n_jobs"), ("n_jobs", 1.5, "n_jobs"), ("random_state", "seed", "random_state"),
    ("validation_data", "one array", "validation_data"),
    ("validation_data", "other features", "validation_data"),
    ("validation_data", "NaN", "validation_data"),
    ("validation_data", "labels outside the classes", "validation_data"),
]

SPARSE_MULTICLASS_BAD_FIT = SPARSE_BAD_FIT + ["partial_fit: other labels",
                                              "outlier_probability: unseen label"]

sparse_multiclass_bad_problems = st.fixed_dictionaries({
    **data_problems,
    "n": st.integers(4, 20),
    "n_classes": st.integers(2, 4),
    "model": st.sampled_from(["robust", "standard"]),
    "tied_sites": st.booleans(),
})

#: every kind of bad input of the sparse multi-class estimator
SPARSE_MULTICLASS_BAD = (BAD_DATA + SPARSE_MULTICLASS_BAD_FIT
                         + [f"{name}={value!r}" for name, value, _ in SPARSE_MULTICLASS_BAD_PARAMS])


def _sparse_multiclass_bad_value(name, value, X, y, n_classes):
    """The bad value itself, and other parameters that it needs, for
    SPARSE_MULTICLASS_BAD_PARAMS."""
    from gpc.kernels import RBF
    if name in ("inducing_points", "validation_data"):
        return _sparse_bad_value(name, value, X, y, "ep")
    if name == "label_noise" and value == "(l - 1)/l":
        return (n_classes - 1) / n_classes, {"model": "robust", "label_noise_bounds": "fixed"}
    if name == "label_noise" and isinstance(value, str) and "standard" in value:
        return 0.1, {"model": "standard"}
    if name == "label_noise" and isinstance(value, str) and "outside" in value:
        return 0.3, {"model": "robust", "label_noise_bounds": (1e-6, 0.2)}
    if name == "label_noise":
        return value, {"model": "robust"}
    if name == "label_noise_bounds":
        return value, {"model": "robust", "label_noise": 0.1}
    if name == "tied_sites" and "beta" in str(value):
        return True, {"model": "robust", "label_noise": "beta"}
    if name == "shared_kernel" and "list" in str(value):
        return True, {"kernel": [RBF(1.0)] * n_classes}
    if name == "kernel" and value == "a list of the wrong length":
        return [RBF(1.0)] * (n_classes + 1), {}
    if name == "kernel":
        return RBF(1.0, length_scale_bounds=(10.0, 100.0)), {}
    return value, {}


def _sparse_multiclass_bad_fit(kind, make, X, y, classes):
    """partial_fit and outlier_probability misuse: (call, exception, pattern)."""
    fitted = _fitter(make, X, y)
    if kind in SPARSE_BAD_FIT:
        return _sparse_bad_fit(kind, make, X, y, classes)
    if kind == "partial_fit: other labels":       # the same rows, their labels shifted by one
        shifted = classes[(np.searchsorted(classes, y) + 1) % len(classes)]
        return (lambda: fitted().partial_fit(X, shifted)), ValueError, "labels"
    other = np.array(["never seen"] * len(y)) if classes.dtype.kind == "U" else np.full(len(y), 99)
    return (lambda: fitted().outlier_probability(X, other)), ValueError, "not in classes_"


def _check_sparse_multiclass_bad(p, kind):
    from gpc import SparseMultiClassGPC
    X, y, X_test, classes = _make_data(p, p["n"], p["n_classes"])
    if kind in ("partial_fit: other labels", "partial_fit: other rows"):
        p = {**p, "tied_sites": False}    # tied sites keep no per-row state: any rows are a stream
    tied = dict(tied_sites=True, label_noise=0.1) if p["tied_sites"] else {}
    base = dict(model=p["model"], max_iter=1, n_inducing=3, progress=False, random_state=0,
                **(tied if p["model"] == "robust" else dict(tied_sites=p["tied_sites"])))
    make = lambda **kw: SparseMultiClassGPC(**{**base, **kw})   # noqa: E731
    if kind in BAD_DATA:
        call, exc, match = _bad_data(kind, make, X, y, X_test)
    elif kind in SPARSE_MULTICLASS_BAD_FIT:
        call, exc, match = _sparse_multiclass_bad_fit(kind, make, X, y, classes)
    else:
        name, value, match = SPARSE_MULTICLASS_BAD_PARAMS[
            SPARSE_MULTICLASS_BAD.index(kind) - len(BAD_DATA) - len(SPARSE_MULTICLASS_BAD_FIT)]
        value, extra = _sparse_multiclass_bad_value(name, value, X, y, p["n_classes"])
        if "label_noise" in extra or "label_noise" == name or "tied_sites" in extra:
            base.pop("label_noise", None)
        call, exc = (lambda: make(**{**extra, name: value}).fit(X, y)), ValueError
    _expect_bad("sparse multiclass", call, exc, match)


@_examples(30)    # derandomised
@given(_sparse_multiclass_problems(tied_sites=False))
def test_sparse_multiclass_estimator_obeys_the_exception_policy(p):
    _check_sparse_multiclass(p)


#: tied sites on rows far from every inducing point of a class (a_ik = 0): the local EP's cavity
#: variances v_c are 0 or underflow, where its precision-form cavities and derivatives were 0/0 (a
#: NaN log evidence, and a NaN gradient that reached the kernel as "invalid value in matmul")
TIED_FAR_ROWS = [
    # RBF(1) on rows ~1e3 apart: every a_ik = 0, the local EP's cavity variances v_c are 0
    dict(seed=5468, d=3, log10_scale=3.554, columns="same scale", duplicates="none",
         constant_columns=2, container="float32", labels="bool", n=9, n_classes=4,
         model="standard", label_noise="beta", learn_label_noise=False, a0=1.6, b0=1.0,
         shared_kernel=False, shared_inducing=False, batch_size="auto", max_iter=3,
         tied_sites=True, learning_rate=3.8, damping=0.685, optimize_inducing=True,
         inducing_points="array", n_inducing=4, jitter=1e-8, validation=True, n_jobs=None,
         random_state=None, fit="fit", kernel="C * RBF(1)"),
    # three rows: the first Adadelta step shrinks the length scales until v_c underflows (1e-165)
    dict(seed=0, d=1, log10_scale=-3.0, columns="same scale", duplicates="none",
         constant_columns=0, container="float64", labels="int", n=3, n_classes=2,
         model="standard", label_noise="beta", learn_label_noise=False, a0=1.0, b0=1.0,
         shared_kernel=False, shared_inducing=False, batch_size=None, max_iter=2, tied_sites=True,
         learning_rate=1.0, damping=None, optimize_inducing=True, inducing_points="kmeans",
         n_inducing=1, jitter=0.0, validation=False, n_jobs=None, random_state=1, fit="fit",
         kernel="default"),
]


@pytest.mark.parametrize("example", range(len(TIED_FAR_ROWS)))
def test_sparse_multiclass_tied_sites_on_rows_far_from_the_inducing_points(example):
    _check_sparse_multiclass(TIED_FAR_ROWS[example])


@pytest.mark.parametrize("kind", SPARSE_MULTICLASS_BAD)
@_examples(2)
@given(sparse_multiclass_bad_problems)
def test_sparse_multiclass_estimator_rejects_bad_input(kind, p):
    _check_sparse_multiclass_bad(p, kind)


@pytest.mark.slow
def test_sparse_multiclass_estimator_obeys_the_exception_policy_many():
    _survey("sparse multiclass", _sparse_multiclass_problems(tied_sites=False),
            _check_sparse_multiclass, 1000)


@pytest.mark.slow
def test_sparse_multiclass_tied_sites_obey_the_exception_policy_many():
    _survey("sparse multiclass, tied sites", _sparse_multiclass_problems(tied_sites=True),
            _check_sparse_multiclass, 600)


@pytest.mark.slow
@pytest.mark.parametrize("kind", SPARSE_MULTICLASS_BAD)
@_examples(25)
@given(sparse_multiclass_bad_problems)
def test_sparse_multiclass_estimator_rejects_bad_input_many(kind, p):
    _check_sparse_multiclass_bad(p, kind)


# -- fitted states: row order, short fits, shards, interrupts, prediction memory ---------------------
#
# Every estimator on data with a learnable answer (Gaussian clusters, one per class), under the
# conditions that left states outside the policy: rows sorted by class (minibatches of one class),
# every max_iter from 1 to 10, 1-3 shards of the in-process engine under every noise treatment,
# KeyboardInterrupts at random points of a fit, and SparseMultiClassGPC.predict_proba's memory at
# C = 50.  A fitted state is valid when its probabilities are in [0, 1] and sum to 1, its log
# evidence is finite (and ≤ 0 where it is EP's approximation of the labels' probability), and
# its outlier rate and probabilities are in [0, 1] (_check_state); an interrupted or failed fit
# leaves a valid state or none (predict raises NotFittedError).

#: EP's log evidence approximates a probability of the labels: ≤ 0 up to the rounding slack of
#: gpc.inference's own check
EVIDENCE_SLACK = 1e-6


def _clusters(seed, n, n_classes, d=2, spread=3.0, sort=False):
    """n rows of n_classes Gaussian clusters in d dimensions (centres spread apart, unit noise),
    labels 0 … C − 1 (every class present), in random order or sorted by class."""
    rng = np.random.default_rng(seed)
    centres = spread * rng.standard_normal((n_classes, d))
    y = np.arange(n) % n_classes
    rng.shuffle(y)
    X = centres[y] + rng.standard_normal((n, d))
    if sort:
        order = np.argsort(y, kind="stable")
        X, y = X[order], y[order]
    return X, y


def _ordered(seed, n, d=4, n_classes=3):
    """n rows N(0, I_d) in n_classes ordered classes: the terciles (for 3) of a random projection,
    the clean data on which batch EP's Beta once swung between ρ = 0.99 and 0 over max_iter."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    score = X @ rng.standard_normal(d)
    y = np.searchsorted(np.quantile(score, np.arange(1, n_classes) / n_classes), score)
    return X, y


def _data(kind, seed, n, n_classes):
    return _clusters(seed, n, n_classes) if kind == "clusters" else _ordered(seed, n)


def _check_state(model, X_test, ep_evidence):
    """A fitted estimator's state inside the policy; returns its probabilities on X_test."""
    proba = model.predict_proba(X_test)
    assert np.all(np.isfinite(proba)) and np.all((proba >= 0.0) & (proba <= 1.0))
    # rows of ≤ 50 non-negative terms normalised: within a few dozen ulp of 1
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0.0, atol=1e-12)
    log_z = float(model.log_marginal_likelihood_value_)
    assert np.isfinite(log_z), f"log evidence {log_z}"
    if ep_evidence:
        assert log_z <= EVIDENCE_SLACK, f"EP's log evidence {log_z:.6g} > 0"
    elif log_z > EVIDENCE_SLACK:
        OUTCOMES["fitted states: a bound or estimate above 0 (not EP)"] += 1
    for name in ("outlier_rate_",):
        if hasattr(type(model), name) or hasattr(model, name):
            value = getattr(model, name)
            assert 0.0 <= value <= 1.0, f"{name} = {value}"
    rho = getattr(model, "outlier_probability_", None) if not getattr(model, "tied_sites", False) \
        else None
    if rho is not None:
        assert np.all((rho >= 0.0) & (rho <= 1.0)), "an outlier probability outside [0, 1]"
    return proba


def _absent_or_valid(model, X_test, ep_evidence):
    """What an interrupted or failed fit leaves: a valid state, or none at all (predict raises
    NotFittedError and no fitted attribute is left holding NaN)."""
    from gpc._estimator import NotFittedError
    try:
        model.predict_proba(X_test)
    except NotFittedError:
        for name in ("log_marginal_likelihood_value_", "history_", "n_iter_"):
            try:
                value = getattr(model, name)
            except (AttributeError, NotFittedError):
                continue
            raise AssertionError(f"an unfitted estimator keeps {name} = {value!r}")
        return "absent"
    _check_state(model, X_test, ep_evidence)
    return "valid"


def _estimator_cases():
    """(name, factory(max_iter, random_state), whether its evidence is EP's, data size n, classes)
    for every estimator and its training modes."""
    from gpc import (GaussianProcessClassifier, MultiClassGPC, SparseGaussianProcessClassifier,
                     SparseMultiClassGPC)
    from gpc.kernels import RBF, ConstantKernel
    cases = []

    def add(name, make, ep, n, n_classes, data="clusters"):
        cases.append((name, make, ep, n, n_classes, data))

    for method, lik in [("ep", "probit"), ("laplace", "probit"), ("pl", "noisy_threshold")]:
        add(f"GaussianProcessClassifier {method}/{lik}",
            lambda it, rs, method=method, lik=lik: GaussianProcessClassifier(
                ConstantKernel(1.0) * RBF(1.0), method=method, likelihood=lik,
                max_iter=it if method != "laplace" else None, random_state=rs),
            False, 120, 2)
    for model, noise in [("robust", "beta"), ("robust", 0.05), ("standard", "beta")]:
        add(f"MultiClassGPC {model}/{noise}",
            lambda it, rs, model=model, noise=noise: MultiClassGPC(
                RBF(2.0), model=model, label_noise=noise, optimizer=_small_lbfgsb,
                max_iter=it or 500, random_state=rs),
            True, 60, 3)
    for method in ["ep", "pl", "gfitc", "svi"]:
        for batch in ([None, 60] if method != "gfitc" else [None]):
            add(f"SparseGaussianProcessClassifier {method} batch {batch}",
                lambda it, rs, method=method, batch=batch: SparseGaussianProcessClassifier(
                    method=method, n_inducing=10, batch_size=batch, max_iter=it or 30,
                    random_state=rs, progress=False),
                method in ("ep", "gfitc"), 400, 2)
    for method, noise, batch, tied in [("ep", "beta", None, False), ("ep", "beta", 60, False),
                                       ("ep", 0.05, None, False), ("ep", 0.05, 60, False),
                                       ("ep", 0.05, 60, True), ("ep", "standard", None, False),
                                       ("vi", 0.05, None, False), ("vi", 0.05, 60, False)]:
        model = "standard" if noise == "standard" else "robust"
        label_noise = "beta" if noise == "standard" else noise
        add(f"SparseMultiClassGPC {method}/{noise} batch {batch}" + (" tied" if tied else ""),
            lambda it, rs, method=method, model=model, label_noise=label_noise, batch=batch,
            tied=tied: SparseMultiClassGPC(
                method=method, model=model, label_noise=label_noise, n_inducing=10,
                batch_size=batch, tied_sites=tied, max_iter=it or 30, random_state=rs,
                progress=False),
            method == "ep", 450, 3)
    add("SparseMultiClassGPC ep/beta batch None m 30, ordered classes",
        lambda it, rs: SparseMultiClassGPC(n_inducing=30, batch_size=None, max_iter=it or 30,
                                           random_state=rs, progress=False),
        True, 2000, 3, "ordered")
    return cases


ESTIMATOR_CASES = _estimator_cases()
CASE_NAMES = [name for name, *_ in ESTIMATOR_CASES]


def _fit_quietly(model, X, y):
    """fit, with the policy's warnings allowed (and counted) and no other."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model.fit(X, y)
            error = None
        except NumericalError as exc:
            error = exc
    _warnings_allowed(caught, (ConvergenceWarning, NegativeSitesWarning), "fitted states")
    return error


def _accuracy(model, X, y):
    return float(np.mean(model.predict(X) == y))


#: largest accuracy lost to class-sorted rows on 300 test rows: the binomial sd of an accuracy near
#: 0.95 over 300 rows is 0.013, and two fits differ also by their minibatches' draws; the
#: order-dependence this catches cost 0.27 (0.97 against 0.70)
SORTED_ROWS_LOSS = 0.05


def _check_sorted_rows(case, seed):
    name, make, ep, n, n_classes, data = ESTIMATOR_CASES[case]
    X, y = _data(data, seed, n + 300, n_classes)
    X_test, y_test = X[n:], y[n:]
    X, y = X[:n], y[:n]
    order = np.argsort(y, kind="stable")
    OUTCOMES[f"sorted rows: {name}"] += 1
    fits = []
    for rows in (np.arange(n), order):
        model = make(None, seed)
        error = _fit_quietly(model, X[rows], y[rows])
        if error is not None:
            OUTCOMES[f"sorted rows: {type(error).__name__}"] += 1
            assert _absent_or_valid(model, X_test, ep) in ("absent", "valid")
            return
        _check_state(model, X_test, ep)
        fits.append(_accuracy(model, X_test, y_test))
    shuffled, sorted_ = fits
    assert sorted_ >= shuffled - SORTED_ROWS_LOSS, (
        f"{name}: accuracy {sorted_:.3f} on class-sorted rows against {shuffled:.3f} shuffled")


def _check_short_fits(case, seed):
    name, make, ep, n, n_classes, data = ESTIMATOR_CASES[case]
    X, y = _data(data, seed, n + 100, n_classes)
    X_test, X, y = X[n:], X[:n], y[:n]
    for max_iter in range(1, 11):
        model = make(max_iter, seed)
        OUTCOMES[f"short fits: {name}"] += 1
        error = _fit_quietly(model, X, y)
        if error is not None:
            OUTCOMES[f"short fits: {type(error).__name__}"] += 1
            assert _absent_or_valid(model, X_test, ep) in ("absent", "valid")
            continue
        _check_state(model, X_test, ep)


#: every noise treatment of SparseMultiClassGPC (model, label_noise, label_noise_bounds)
NOISE_TREATMENTS = [("robust", "beta", None), ("robust", 0.05, "fixed"),
                    ("robust", 0.05, (1e-6, 0.4)), ("standard", "beta", None)]


def _check_shards(treatment, n_shards, seed):
    from gpc import SparseMultiClassGPC
    from gpc.distributed import InProcessEngine
    model_kind, noise, bounds = NOISE_TREATMENTS[treatment]
    X, y = _clusters(seed, 450, 3)
    X_test, y_test, X, y = X[300:], y[300:], X[:300], y[:300]
    extra = {} if bounds is None else {"label_noise_bounds": bounds}
    scores = []
    for client in (None, InProcessEngine(n_shards=n_shards)):
        model = SparseMultiClassGPC(model=model_kind, label_noise=noise, n_inducing=8,
                                    batch_size=None, max_iter=20, random_state=seed,
                                    progress=False, client=client, **extra)
        OUTCOMES[f"shards: {model_kind}/{noise}" + ("" if client is None else f", {n_shards}")] += 1
        error = _fit_quietly(model, X, y)
        if error is not None:
            OUTCOMES[f"shards: {type(error).__name__}"] += 1
            assert _absent_or_valid(model, X_test, True) in ("absent", "valid")
            return
        _check_state(model, X_test, True)
        scores.append(_accuracy(model, X_test, y_test))
    # the shards add the same partial sums in another grouping: the same model to rounding
    assert scores[1] >= scores[0] - SORTED_ROWS_LOSS, (
        f"accuracy {scores[1]:.3f} on {n_shards} shards against {scores[0]:.3f} in process")


class _InterruptAfter:
    """A trace hook that counts the calls of gpc's functions in this thread and, from the k-th on
    (k = None: never), raises KeyboardInterrupt there: an interrupt at a random point of a fit, as
    a Ctrl-C can arrive."""

    def __init__(self, k=None):
        self.k, self.calls, self.fired = k, 0, False

    def __call__(self, frame, event, arg):
        if event == "call" and not self.fired and "/gpc/" in frame.f_code.co_filename:
            self.calls += 1
            if self.k is not None and self.calls >= self.k:
                self.fired = True
                raise KeyboardInterrupt("injected")
        return None


def _traced_fit(model, X, y, hook):
    """fit under ``hook``: how it ended."""
    import sys
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        sys.settrace(hook)
        try:
            model.fit(X, y)
            return "returned"
        except KeyboardInterrupt:
            return "raised KeyboardInterrupt"
        except NumericalError:
            return "raised NumericalError"
        finally:
            sys.settrace(None)


def _check_interrupt(case, seed):
    """A fit interrupted at a call drawn uniformly from all its calls of gpc's functions (counted
    on the same fit uninterrupted) leaves a valid state or none."""
    name, make, ep, n, n_classes, data = ESTIMATOR_CASES[case]
    rng = np.random.default_rng(seed)
    X, y = _data(data, seed, n + 50, n_classes)
    X_test, X, y = X[n:], X[:n], y[:n]
    max_iter = int(rng.integers(1, 6))
    count = _InterruptAfter()
    _traced_fit(make(max_iter, seed), X, y, count)
    hook = _InterruptAfter(int(rng.integers(1, count.calls + 1)))
    model = make(max_iter, seed)
    how = _traced_fit(model, X, y, hook)
    left = _absent_or_valid(model, X_test, ep)
    OUTCOMES[f"interrupts: {'fired' if hook.fired else 'fit ended first'}, {how}, {left}"] += 1


def _predict_peak_bytes(n_rows, n_classes=50):
    """Peak bytes traced while SparseMultiClassGPC (C classes, fitted on 10 rows of each) predicts
    n_rows rows."""
    import tracemalloc
    from gpc import SparseMultiClassGPC
    X, y = _clusters(0, 10 * n_classes, n_classes, d=3, spread=6.0)
    model = SparseMultiClassGPC(n_inducing=5, shared_inducing=True, label_noise=0.05,
                                max_iter=1, random_state=0, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    X_new = np.random.default_rng(1).standard_normal((n_rows, 3)) * 6.0
    tracemalloc.start()
    try:
        proba = model.predict_proba(X_new)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert proba.shape == (n_rows, n_classes)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0.0, atol=1e-12)
    return peak


#: the bound the issue sets: 10,000 rows at C = 50 under 500 MB at the peak
PREDICT_PEAK_BYTES = 500e6


# quick parts: one seed of each, a few cases (the slow mode runs them all)

@pytest.mark.parametrize("case", [CASE_NAMES.index(name) for name in CASE_NAMES
                                  if name.startswith("SparseMultiClassGPC ep/0.05 batch 60")])
def test_class_sorted_rows(case):
    _check_sorted_rows(case, 0)


def test_a_fit_interrupted_at_random_points_leaves_a_valid_state_or_none():
    case = CASE_NAMES.index("SparseGaussianProcessClassifier ep batch None")
    for seed in range(3):
        _check_interrupt(case, seed)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(ESTIMATOR_CASES)), ids=CASE_NAMES)
def test_class_sorted_rows_many(case):
    failures = []
    for seed in range(3):
        try:
            _check_sorted_rows(case, seed)
        except AssertionError as exc:
            OUTCOMES["sorted rows OUTSIDE THE POLICY"] += 1
            failures.append(f"seed {seed}: {exc}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(ESTIMATOR_CASES)), ids=CASE_NAMES)
def test_every_short_fit_leaves_a_valid_state_many(case):
    failures = []
    for seed in range(2):
        try:
            _check_short_fits(case, seed)
        except AssertionError as exc:
            OUTCOMES["short fits OUTSIDE THE POLICY"] += 1
            failures.append(f"seed {seed}: {exc}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("n_shards", [1, 2, 3])
@pytest.mark.parametrize("treatment", range(len(NOISE_TREATMENTS)),
                         ids=[f"{m}-{e}-{b}" for m, e, b in NOISE_TREATMENTS])
def test_shards_under_every_noise_treatment_many(treatment, n_shards):
    failures = []
    for seed in range(3):
        try:
            _check_shards(treatment, n_shards, seed)
        except AssertionError as exc:
            OUTCOMES["shards OUTSIDE THE POLICY"] += 1
            failures.append(f"seed {seed}: {exc}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(ESTIMATOR_CASES)), ids=CASE_NAMES)
def test_interrupts_at_random_points_many(case):
    failures = []
    for seed in range(10):
        try:
            _check_interrupt(case, seed)
        except AssertionError as exc:
            OUTCOMES["interrupts OUTSIDE THE POLICY"] += 1
            failures.append(f"seed {seed}: {exc}")
    assert not failures, "\n".join(failures)


@pytest.mark.slow
def test_predict_proba_memory_at_fifty_classes():
    peak = _predict_peak_bytes(10_000)
    OUTCOMES[f"predict_proba peak at C = 50, 10,000 rows: {peak / 1e6:.0f} MB"] += 1
    assert peak < PREDICT_PEAK_BYTES, f"peak {peak / 1e6:.0f} MB"
