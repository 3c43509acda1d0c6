"""The codes the Python layer hands the compiled modules name the maths they should: a likelihood
called "probit" runs the probit integrals, the rule "ep" moment matching and "pl" PL's linear
regression, a Matérn of ν = 3/2 the ν = 3/2 kernel; and the compiled linear-algebra layer's
mirror and signed Gram do what they say."""

import numpy as np
import pytest
from scipy.special import ndtr

from gpc import _lapack, _likelihoods, _site_rule
from gpc.inference.rules import ON_NEGATIVE, RULES, Rule
from gpc.kernels import RBF, Matern
from gpc.likelihoods import get_likelihood

_MEAN = np.array([-1.3, -0.2, 0.0, 0.4, 2.1])
_VAR = np.array([0.3, 1.0, 2.5, 0.7, 4.0])
_Y = np.array([1.0, -1.0, 1.0, 1.0, -1.0])


def _phi(z):
    return np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)


@pytest.mark.parametrize("name, code", [("probit", _likelihoods.LIK_PROBIT),
                                        ("logit", _likelihoods.LIK_LOGIT),
                                        ("noisy_threshold", _likelihoods.LIK_NOISY_THRESHOLD),
                                        ("heaviside", _likelihoods.LIK_HEAVISIDE)])
def test_a_named_likelihood_carries_the_compiled_kind_of_that_name(name, code):
    assert get_likelihood(name).compiled_spec()[0] == code


def test_the_probit_likelihood_runs_the_probit_integral():
    # Z = Φ(y m / √(1 + v)) (R&W eq. (3.82)); logit's Z differs from it by ~1e-2 here
    log_z = get_likelihood("probit").log_tilted_normaliser(_Y, _MEAN, _VAR)
    np.testing.assert_allclose(log_z, np.log(ndtr(_Y * _MEAN / np.sqrt(1.0 + _VAR))), rtol=1e-12)
    logit = get_likelihood("logit").log_tilted_normaliser(_Y, _MEAN, _VAR)
    assert np.max(np.abs(logit - log_z)) > 1e-3


def _probit_sites(rule):
    """The sites the rule named ``rule`` fits from the marginals (no old sites: cavity = marginal)."""
    spec = get_likelihood("probit").compiled_spec()
    tau, nu = np.zeros(5), np.zeros(5)
    code_rule, code_neg = Rule(rule).codes
    status = _site_rule.parallel_update(*spec, code_rule, code_neg, 1.0, _Y, _MEAN.copy(),
                                        _VAR.copy(), tau, nu)[0]
    assert status == _site_rule.SITE_UPDATED
    return tau, nu


def test_the_rule_named_ep_matches_moments():
    # probit's tilted moments in closed form (R&W eq. (3.58)); the site is tilted / cavity
    s = np.sqrt(1.0 + _VAR)
    z = _Y * _MEAN / s
    r = _phi(z) / ndtr(z)
    mean = _MEAN + _Y * _VAR * r / s
    var = _VAR - _VAR ** 2 * r * (z + r) / (1.0 + _VAR)
    tau, nu = _probit_sites("ep")
    np.testing.assert_allclose(tau, 1.0 / var - 1.0 / _VAR, rtol=1e-9)
    np.testing.assert_allclose(nu, mean / var - _MEAN / _VAR, rtol=1e-9)


def test_the_rule_named_pl_is_the_statistical_linear_regression():
    # PL eq. (15)-(16) for probit: E[y] = 2Φ(m/s) − 1, Cov[f, E(y|f)] = 2 v φ(m/s)/s, s = √(1 + v)
    s = np.sqrt(1.0 + _VAR)
    mu_y = 2.0 * ndtr(_MEAN / s) - 1.0
    A = 2.0 * _phi(_MEAN / s) / s
    omega = 1.0 - mu_y ** 2 - A * A * _VAR
    tau, nu = _probit_sites("pl")
    np.testing.assert_allclose(tau, A * A / omega, rtol=1e-9)
    np.testing.assert_allclose(nu, A * (_Y - (mu_y - A * _MEAN)) / omega, rtol=1e-9)


def test_rule_and_policy_names_are_the_compiled_modules():
    assert RULES == {"ep": _site_rule.RULE_EP, "pl": _site_rule.RULE_PL}
    assert ON_NEGATIVE["keep"] == _site_rule.NEG_KEEP
    assert ON_NEGATIVE["raise"] == _site_rule.NEG_RAISE
    assert len(set(ON_NEGATIVE.values())) == len(ON_NEGATIVE)


@pytest.mark.parametrize("nu, f", [
    (0.5, lambda r: np.exp(-r)),
    (1.5, lambda r: (1.0 + np.sqrt(3.0) * r) * np.exp(-np.sqrt(3.0) * r)),
    (2.5, lambda r: (1.0 + np.sqrt(5.0) * r + 5.0 * r * r / 3.0) * np.exp(-np.sqrt(5.0) * r)),
    (None, lambda r: np.exp(-0.5 * r * r)),
])
def test_each_stationary_kernel_runs_its_own_compiled_kind(nu, f):
    X = np.random.default_rng(3).normal(size=(40, 2))
    Z = np.random.default_rng(4).normal(size=(7, 2))
    kernel = RBF(0.8) if nu is None else Matern(length_scale=0.8, nu=nu)
    for A, B in ((X, None), (X, Z)):
        r = np.sqrt(((A[:, None] - (A if B is None else B)[None]) ** 2).sum(-1)) / 0.8
        np.testing.assert_allclose(kernel(A, B), f(r), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n, block", [(1, 64), (5, 2), (130, 64), (131, 7)])
def test_mirror_lower_copies_the_lower_triangle_and_returns_its_argument(n, block):
    A = np.random.default_rng(n).normal(size=(n, n))
    expected = np.tril(A) + np.tril(A, -1).T
    assert _lapack.mirror_lower(A, block) is A
    assert np.array_equal(A, expected)


def test_mirror_lower_takes_only_square_float64_c_arrays():
    with pytest.raises(ValueError):
        _lapack.mirror_lower(np.zeros((3, 4)))
    with pytest.raises(ValueError):
        _lapack.mirror_lower(np.zeros((3, 3)), 0)


def test_add_weighted_gram_adds_a_signed_weighted_gram():
    rng = np.random.default_rng(5)
    A = rng.normal(size=(9, 4))
    w = np.array([1.5, -0.5, 0.0, 2.0, -3.0, 0.25, 0.0, -1.0, 0.5])
    P = rng.normal(size=(4, 4))
    expected = P + A.T @ (w[:, None] * A)
    used = _lapack.add_weighted_gram(P, A, w, np.empty_like(A))
    assert used == 7
    np.testing.assert_allclose(np.tril(P), np.tril(expected), rtol=1e-12, atol=1e-12)
