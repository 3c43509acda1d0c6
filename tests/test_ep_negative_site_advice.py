"""EP with negative sites (the noisy threshold): warm starts whose sites do not fit the new kernel
start cold, and a run that negative sites leave without a posterior or without cavities says what
the user can do under the schedule in use (never "use the sequential schedule" to a sequential run).
"""

import copy
import types
import warnings

import numpy as np
import pytest

from gpc import GaussianProcessClassifier, infer
from gpc.exceptions import ConvergenceWarning, DivergenceError, NotPositiveDefiniteError
from gpc.inference import _sites
from gpc.kernels import RBF, ConstantKernel
from gpc.likelihoods import NoisyThreshold

SCHEDULES = ["sequential", "parallel"]


def _separable(seed):
    """Labels by the sign of the first feature (5 % of its spread as noise), n in [10, 50), d in
    [1, 4), on a random scale: the data on which the noisy threshold's fits failed."""
    rng = np.random.default_rng(seed)
    n, d = int(rng.integers(10, 50)), int(rng.integers(1, 4))
    X = rng.normal(size=(n, d)) * 10.0 ** rng.uniform(-2, 2)
    y = (X[:, 0] + 0.05 * rng.normal(size=n) * X.std() > 0).astype(int)
    return X, y


def _fit(X, y, eps, schedule, **kw):
    model = GaussianProcessClassifier(kernel=ConstantKernel(1.0) * RBF(1.0),
                                      likelihood=NoisyThreshold(eps), method="ep",
                                      schedule=schedule, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # ConvergenceWarning, NegativeSitesWarning
        return model.fit(X, y)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("eps", [0.01, 0.05, 0.1, 0.2])
def test_noisy_threshold_with_a_learnt_kernel_fits(eps, schedule):
    """On these 45 rows 7 of the 8 fits raised NotPositiveDefiniteError: the optimiser's warm start
    (the last θ's sites, negative ones among them) gave no posterior at the next θ.  Such a start
    is now a cold one, and every fit ends with a finite evidence ≤ 0."""
    X, y = _separable(33)
    model = _fit(X, y, eps, schedule)
    assert np.isfinite(model.log_marginal_likelihood_value_)
    assert model.log_marginal_likelihood_value_ <= 0.0


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_warm_start_sites_without_a_posterior_start_cold(schedule):
    """Sites that define no distribution with this K (K⁻¹ + T has a negative eigenvalue): a run
    warm-started from them is the cold run, to the bit."""
    X = np.linspace(-3.0, 3.0, 12)[:, None]
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    K = RBF(1.0)(X)
    tau = np.full(12, 0.5)
    tau[3] = -np.linalg.inv(K)[3, 3] - 1.0      # e₃ᵀ (K⁻¹ + T) e₃ = −1.5
    lik = NoisyThreshold(0.1)
    with pytest.raises(NotPositiveDefiniteError):     # these sites indeed give no posterior
        _sites.site_posterior(K, tau, np.zeros(12), np.zeros(12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cold = infer(K, y, likelihood=lik, method="ep", schedule=schedule)
        bad = copy.copy(cold)         # a previous result that carries these sites
        bad.posterior = types.SimpleNamespace(site_precision=tau, site_location=np.zeros(12))
        warm = infer(K, y, likelihood=lik, method="ep", schedule=schedule, init=bad)
    assert warm.log_evidence == cold.log_evidence
    np.testing.assert_array_equal(warm.posterior.site_precision, cold.posterior.site_precision)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_indefinite_sites_say_what_applies_to_the_schedule(schedule):
    """The sites' posterior does not exist: a DivergenceError (a numerical failure on valid input,
    gpc.exceptions) naming the sweep and the remedies for the schedule in use."""
    K = np.eye(3)
    tau = np.array([-2.0, 0.5, 0.5])          # K⁻¹ + T = diag(−1, 1.5, 1.5)
    with pytest.raises(DivergenceError) as err:
        _sites._site_posterior(K, tau, np.zeros(3), np.zeros(3), "ep", schedule, "keep", 5)
    message = str(err.value)
    assert f"EP ({schedule}): after sweep 5" in message and "indefinite" in message
    assert "on_negative='pl'" in message and "method='pl'" in message
    assert "fixed kernel" in message
    assert ("schedule='sequential'" in message) == (schedule == "parallel")
    assert "use the sequential schedule" not in message


def _no_cavity_problem():
    """Five points on a line, two of them 1e-4 apart, RBF(ℓ = 2.4, σ² = 7.1): with the noisy
    threshold at ε = 0.05 and on_negative="keep" both schedules end with sites that no update
    could give a cavity."""
    rng = np.random.default_rng(343)
    n, d = int(rng.integers(5, 40)), int(rng.integers(1, 3))
    X = rng.normal(size=(n, d))
    if rng.random() < 0.5:
        X[rng.integers(0, n, n // 3)] = (X[rng.integers(0, n, n // 3)]
                                         + 1e-4 * rng.normal(size=(n // 3, d)))
    y = np.where(X[:, 0] + 0.1 * rng.normal(size=n) > 0, 1.0, -1.0)
    ell, sf2 = 10 ** rng.uniform(-0.5, 2.5), 10 ** rng.uniform(-1, 3)
    K = sf2 * np.exp(-0.5 * ((X[:, None] - X[None]) ** 2).sum(-1) / ell ** 2) + 1e-10 * sf2 * np.eye(n)
    return K, y


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_sites_without_a_cavity_say_what_applies_to_the_schedule(schedule):
    """A run that ends with sites no update could give a cavity names the remedies that apply to
    its schedule and on_negative, and the first of them (on_negative='pl') runs on the same
    problem."""
    K, y = _no_cavity_problem()
    lik = NoisyThreshold(0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DivergenceError, match="without a cavity") as err:
            infer(K, y, likelihood=lik, method="ep", schedule=schedule)
        message = str(err.value)
        assert "on_negative='pl'" in message and "method='pl'" in message
        assert ("schedule='sequential'" in message) == (schedule == "parallel")
        assert "use the sequential schedule" not in message
        result = infer(K, y, likelihood=lik, method="ep", schedule=schedule, on_negative="pl")
    assert np.isfinite(result.log_evidence) and result.log_evidence <= 0.0
