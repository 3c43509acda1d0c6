"""Hard but valid problems (issue 17): every run ends with a usable result or a policy exception.

A usable result is finite, with a log evidence ≤ 0 and variances ≥ 0 up to rounding; the policy
exceptions are those of gpc.exceptions (ValueError/TypeError for bad input, NumericalError for a
numerical failure on valid input).  Three families, each a few seconds in CI:

- separable data at a prior variance of 1e4 (the site precisions and the evidence's scale are
  extreme; issue 17 item 7 met here the parallel schedules' oscillation);
- the noisy threshold, a non-log-concave likelihood, on every bundled binary data set (a stratified
  subset) under every negative-variance policy of EP, and PL; the default policy's two schedules
  reach the same EP fixed point;
- a K of numerical rank 1, as given (infer adds the jitter its check needs), with an explicit
  jitter, and unchecked (check_kernel=False: the methods meet the singular K itself).
"""

import warnings

import numpy as np
import pytest

from gpc import datasets, infer
from gpc.exceptions import NumericalError
from gpc.likelihoods import NoisyThreshold

from helpers import rbf

#: every method with the likelihoods and schedules it takes
RUNS = [("laplace", "probit", None), ("laplace", "logit", None), ("ep", "probit", "sequential"),
        ("ep", "probit", "parallel"), ("ep", "heaviside", "sequential"),
        ("ep", "heaviside", "parallel"), ("pl", "probit", "sequential"),
        ("pl", "probit", "parallel"), ("pl", "logit", "parallel"), ("kl", "logit", None),
        ("kl", "probit", None), ("vb", "logit", None), ("vb", "probit", None),
        ("mf-ensemble", "probit", None), ("mf-naive", "probit", None),
        ("mf-ensemble", "heaviside", None), ("online", "probit", None), ("online", "heaviside", None)]


def _run(K, y, method, likelihood, schedule, **options):
    """The result, or None after a policy exception; anything else fails the test."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = infer(K, y, likelihood=likelihood, method=method, schedule=schedule, **options)
    except (ValueError, TypeError, NumericalError):
        return None
    assert np.isfinite(r.log_evidence) and r.log_evidence <= 0.0
    assert np.all(np.isfinite(r.mean))
    var = r.posterior.diag_cov()
    # non-negative up to rounding at the scale of K (1e-12 relative to its largest entry)
    assert np.all(np.isfinite(var)) and np.all(var >= -1e-12 * np.max(np.abs(np.diag(K))))
    return r


def _separable(n=30, seed=0):
    rng = np.random.default_rng(seed)
    y = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    X = rng.standard_normal((n, 2)) * 0.5
    X[:, 0] += 3.0 * y                     # two clusters six standard deviations apart
    return X, y


@pytest.mark.parametrize("method,likelihood,schedule", RUNS)
def test_separable_data_at_prior_variance_1e4(method, likelihood, schedule):
    X, y = _separable()
    r = _run(rbf(X, 1.0, 1e4), y, method, likelihood, schedule)
    if r is not None:
        # a usable fit of separable clusters puts every training latent on its label's side
        assert np.all(np.sign(r.mean) == y)


def _binary_sets():
    return [name for name in datasets.available() if len(np.unique(datasets.load(name).y)) == 2]


def _subset(name, n=60, seed=0):
    X, y = datasets.load(name, return_X_y=True)
    classes = np.unique(y)
    rng = np.random.default_rng(seed)
    idx = np.concatenate([rng.permutation(np.flatnonzero(y == c))[: n // 2] for c in classes])
    X = X[idx].astype(float)
    X = (X - X.mean(0)) / np.where(X.std(0) > 0, X.std(0), 1.0)
    return X, np.where(y[idx] == classes[1], 1.0, -1.0)


@pytest.mark.parametrize("name", _binary_sets())
def test_noisy_threshold_on_the_bundled_data_under_each_policy(name):
    X, y = _subset(name)
    K = rbf(X, np.sqrt(X.shape[1]), 4.0)
    outcomes = {}
    for policy in ("keep", "keep-skip", "raise", "clip", "skip", "pl"):
        for schedule in ("sequential", "parallel"):
            outcomes[policy, schedule] = _run(K, y, "ep", NoisyThreshold(0.05), schedule,
                                              on_negative=policy)
    for schedule in ("sequential", "parallel"):
        outcomes["pl", schedule] = _run(K, y, "pl", NoisyThreshold(0.05), schedule)
    # the policies exist to keep EP going: keep (the default), clip and pl must give a result on
    # these ordinary sets
    for key in (("keep", "sequential"), ("keep", "parallel"), ("clip", "sequential"),
                ("pl", "sequential")):
        assert outcomes[key] is not None, key
    # and the default's two schedules reach one EP fixed point where both converge (thyroid's
    # parallel run needs more than the default 100 sweeps): the same evidence to ~tol
    seq, par = outcomes["keep", "sequential"], outcomes["keep", "parallel"]
    if seq.info["ep_fixed_point"] and par.info["ep_fixed_point"]:
        assert abs(seq.log_evidence - par.log_evidence) < 1e-4


@pytest.mark.parametrize("form", ["as given", "jittered", "unchecked"])
@pytest.mark.parametrize("method,likelihood,schedule", RUNS)
def test_kernel_of_numerical_rank_one(method, likelihood, schedule, form):
    n = 10
    rng = np.random.default_rng(1)
    v = rng.uniform(0.5, 2.0, n)
    K = 3.0 * np.outer(v, v)               # rank 1: f = c v, one latent coefficient
    y = np.where(rng.standard_normal(n) > 0, 1.0, -1.0) * np.sign(v)
    y[0] = -y[0] if np.all(y == y[0]) else y[0]
    options = {}
    if form == "jittered":
        K = K + 1e-8 * np.trace(K) / n * np.eye(n)
    elif form == "unchecked":
        options["check_kernel"] = False
    _run(K, y, method, likelihood, schedule, **options)
