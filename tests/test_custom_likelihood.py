"""A user-defined likelihood: a subclass of gpc.likelihoods.Likelihood that implements only log_prob,
whose moments come from the base class's Gauss-Hermite quadrature (gpc.likelihoods.Likelihood)."""

import pickle

import numpy as np
import pytest
from scipy import special

from gpc.inference import infer
from gpc.likelihoods import Likelihood, Probit
from helpers import toy


class LogProbProbit(Likelihood):
    """Probit written through log_prob only."""

    def log_prob(self, y, f):
        return special.log_ndtr(y * f)


class RobustMax(Likelihood):
    """A mixture of a logit and a uniform label: p(y | f) = r / 2 + (1 − r) σ(y f)."""

    _param_names = ("rate", "gh_order")

    def __init__(self, rate=0.1, gh_order=48):
        self.rate = rate
        self.gh_order = gh_order

    def log_prob(self, y, f):
        return np.log(0.5 * self.rate + (1.0 - self.rate) * special.expit(y * f))


@pytest.fixture(scope="module")
def data():
    X, y = toy(60, seed=4)
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return 2.0 * np.exp(-0.5 * d2), y


def test_quadrature_moments_match_the_closed_forms():
    # Probit's tilted, SLR and predictive moments are closed forms in gpc._likelihoods, its E log p a
    # 48-node quadrature of log Φ's derivatives.  Our 48-node Gauss-Hermite of log Φ alone reproduces
    # them to 1e-7 for cavity variances up to 4 (measured: 1.3e-8 for the tilted variance, 5.2e-8 for
    # dE/dv, where both sides are 48-node rules; at 96 nodes the closed forms agree to 5e-15).
    rng = np.random.default_rng(0)
    y = rng.choice([-1.0, 1.0], 40)
    m = rng.uniform(-3, 3, 40)
    v = rng.uniform(0.05, 4.0, 40)
    ours, ref = LogProbProbit(), Probit()
    for a, b in zip(ours.tilted_moments(y, m, v), ref.tilted_moments(y, m, v)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    for a, b in zip(ours.slr_moments(m, v), ref.slr_moments(m, v)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    for a, b in zip(ours.expected_log_prob(y, m, v), ref.expected_log_prob(y, m, v)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    np.testing.assert_allclose(ours.predictive_probability(m, v), ref.predictive_probability(m, v),
                               rtol=0, atol=1e-7)


@pytest.mark.parametrize("schedule", ["sequential", "parallel"])
def test_probit_through_log_prob_gives_the_builtin_ep_evidence(data, schedule):
    # Same fixed point up to the quadrature error of the moments (< 1e-7 above): evidence and means
    # to 1e-6.
    K, y = data
    ours = infer(K, y, likelihood=LogProbProbit(), method="ep", schedule=schedule, tol=1e-9)
    ref = infer(K, y, likelihood=Probit(), method="ep", schedule=schedule, tol=1e-9)
    assert ours.converged
    assert abs(ours.log_evidence - ref.log_evidence) < 1e-6
    np.testing.assert_allclose(ours.mean, ref.mean, atol=1e-6)


# the mixture is not log-concave, so EP meets (and clips) a few negative site variances
@pytest.mark.filterwarnings("ignore::gpc.inference._sites.NegativeSitesWarning")
@pytest.mark.parametrize("method", ["ep", "pl", "kl", "online"])
def test_robust_max_likelihood_is_fitted(data, method):
    # The mixture with rate 0.1 bounds p(y|f) below by 0.05: it should classify the training set
    # about as well as the logit does (toy data, labels 30 % noisy: accuracy well above chance), and its
    # predictive probabilities stay inside [0.05, 0.95].
    K, y = data
    r = infer(K, y, likelihood=RobustMax(0.1), method=method)
    assert np.isfinite(r.log_evidence)
    p = RobustMax(0.1).predictive_probability(r.mean, np.diag(r.cov))
    assert np.all((p >= 0.05) & (p <= 0.95))
    assert np.mean(np.where(p > 0.5, 1.0, -1.0) == y) > 0.7


def test_custom_likelihood_without_derivatives_refuses_laplace(data):
    K, y = data
    assert RobustMax.name == "robustmax"
    with pytest.raises(ValueError, match="log_prob_derivatives"):
        infer(K, y, likelihood=RobustMax(), method="laplace")


def test_custom_likelihood_pickles_and_compares():
    lik = RobustMax(0.2)
    assert pickle.loads(pickle.dumps(lik)) == lik and lik != RobustMax(0.1)
