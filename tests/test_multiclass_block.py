"""RMGPC's class block (gpc.multiclass._block) against the dense formulas Σ = (K⁻¹ + Λ)⁻¹, μ = Σ v.

The block never forms K⁻¹: it factors B = I + S K S for the non-negative part Λ' of the site
precisions and adds the negative sites by Woodbury's identity.  Here every output is compared with
NumPy's dense inverse on a small well-conditioned K (condition number ~1e3, so the dense reference
itself is good to ~1e-12)."""

import numpy as np
import pytest

from gpc.exceptions import NotPositiveDefiniteError
from gpc.kernels import RBF
from gpc.multiclass._block import ClassBlock
from gpc.posterior import SitePosterior


def _sites(rng, n, negative_share):
    tau = rng.gamma(0.5, 2.0, size=n)
    tau[rng.random(n) < 0.1] = 0.0            # sites not yet refined
    tau[rng.random(n) < 0.05] = 1e-9          # Λ' below the block's threshold: exact columns
    neg = rng.random(n) < negative_share
    tau[neg] = -rng.uniform(0.0, 0.3, size=neg.sum())
    return tau, rng.normal(size=n)


def _dense(K, tau, eta):
    Kinv = np.linalg.inv(K)
    Sigma = np.linalg.inv(Kinv + np.diag(tau))
    mean = Sigma @ eta
    R = Kinv - Kinv @ Sigma @ Kinv                       # K⁻¹ − K⁻¹ Σ K⁻¹
    logdet = np.linalg.slogdet(np.eye(len(tau)) + tau[:, None] * K)[1]
    return Sigma, mean, R, logdet, Kinv @ mean


@pytest.mark.parametrize("negative_share", [0.0, 0.15, 0.3])
def test_block_matches_the_dense_posterior(negative_share):
    rng = np.random.default_rng(3)
    n = 60
    X = rng.normal(size=(n, 3))
    K = RBF(1.5)(X) + 0.1 * np.eye(n)
    Xs = rng.normal(size=(7, 3))
    Kc, kd = RBF(1.5)(Xs, X), np.ones(7)
    for _ in range(3):
        tau, eta = _sites(rng, n, negative_share)
        if negative_share:
            assert np.any(tau < 0)
        Sigma, mean, R, logdet, b = _dense(K, tau, eta)
        assert np.all(np.linalg.eigvalsh(Sigma) > 0)     # these sites do define a Gaussian
        block = ClassBlock(K)
        m, v = block.marginals(tau, eta)
        # double precision throughout: agreement to rounding amplified by cond(K) ~1e3
        np.testing.assert_allclose(m, mean, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(v, np.diag(Sigma), rtol=1e-9, atol=1e-10)
        post = block.posterior(eta)
        np.testing.assert_allclose(post.mean, mean, rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(post.alpha, b, rtol=1e-8, atol=1e-8)
        assert post.log_det_B == pytest.approx(logdet, rel=1e-10, abs=1e-10)
        np.testing.assert_allclose(post.gradient_matrix(), 0.5 * (np.outer(b, b) - R), atol=1e-8)
        pm, pv = post.latent_moments(Kc, kd)
        np.testing.assert_allclose(pm, Kc @ b, atol=1e-9)
        np.testing.assert_allclose(pv, kd - np.einsum("ij,jk,ik->i", Kc, R, Kc), atol=1e-9)
        np.testing.assert_allclose(post.R(), R, atol=1e-8)
        if not negative_share:
            # no negative site: the binary engine's SitePosterior of the same sites, to rounding
            site = SitePosterior(K, tau, eta, np.zeros(n))
            np.testing.assert_allclose(post.gradient_matrix(), site.gradient_matrix(), atol=1e-10)
            np.testing.assert_allclose(post.predict(Kc.T, kd)[1], site.predict(Kc.T, kd)[1],
                                       atol=1e-10)
            np.testing.assert_allclose(post.diag_cov(), site.diag_cov(), rtol=1e-9, atol=1e-12)
            assert post.log_det_B == pytest.approx(site.log_det_B, rel=1e-12)
        # single precision: float32 factor (unit roundoff 6e-8) times cond(B) ≲ 1e3, i.e. ~1e-4
        m32, v32 = ClassBlock(K).marginals(tau, eta, single=True)
        np.testing.assert_allclose(m32, mean, atol=1e-3)
        np.testing.assert_allclose(v32, np.diag(Sigma), rtol=1e-3, atol=1e-4)


def test_mean_update_at_fixed_precisions_matches_a_refactorisation():
    rng = np.random.default_rng(4)
    n = 40
    K = RBF(1.0)(rng.normal(size=(n, 2))) + 0.1 * np.eye(n)
    tau, eta = _sites(rng, n, 0.2)
    block = ClassBlock(K)
    block.marginals(tau, eta)
    eta2 = rng.normal(size=n)
    np.testing.assert_allclose(block.mean(eta2), _dense(K, tau, eta2)[1], rtol=1e-9, atol=1e-10)


def test_sites_without_a_gaussian_raise():
    rng = np.random.default_rng(5)
    n = 30
    K = RBF(1.0)(rng.normal(size=(n, 2))) + 0.1 * np.eye(n)
    tau = np.full(n, 0.5)
    tau[3] = -5.0 / K[3, 3]      # far more negative than the prior precision: K⁻¹ + Λ indefinite
    assert np.min(np.linalg.eigvalsh(np.linalg.inv(K) + np.diag(tau))) < 0
    with pytest.raises(NotPositiveDefiniteError):
        ClassBlock(K).marginals(tau, np.zeros(n))
