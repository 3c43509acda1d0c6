"""Property-based checks of gpc.exceptions' policy over infer() (hypothesis).

CI runs a few dozen derandomised examples; ``-m slow`` runs many more (``-s`` prints the outcome
counts).  The estimator suite fits GaussianProcessClassifier (2-3 classes, OvR and OvO, fixed
kernels) and checks probabilities in [0, 1] whose rows sum to 1.  Every run either returns a
finite result (log evidence ≤ 0, finite mean, non-negative variances) or raises an exception of the
policy: ValueError / TypeError for bad input, gpc.exceptions.NumericalError for a numerical failure.
"""

import collections
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gpc import infer
from gpc.exceptions import NumericalError

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
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = infer(K, y, likelihood=likelihood, method=method, schedule=schedule,
                      max_iter=p["max_iter"])
    except (ValueError, TypeError, NumericalError) as exc:
        OUTCOMES[type(exc).__name__] += 1
        return          # inside the policy (a K that is numerically singular is bad input)
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
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(X, y)
            proba = model.predict_proba(rng.standard_normal((5, 2)) * p["scale"])
    except (ValueError, TypeError, NumericalError) as exc:
        OUTCOMES["estimator " + type(exc).__name__] += 1
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
