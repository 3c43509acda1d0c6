"""SitePosterior's covariance, written without an n x n product temporary (issue 16's memory budget)."""

import numpy as np
import pytest

from gpc._linalg import mirror_lower
from gpc.posterior import SitePosterior


def _problem(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    K = np.exp(-0.5 * ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)) + 1e-8 * np.eye(n)
    tau = rng.uniform(0.0, 3.0, size=n)
    tau[:3] = 0.0                                     # empty sites are allowed (τ = 0)
    return K, tau, rng.normal(size=n)


@pytest.mark.parametrize("n", [1, 7, 300])
def test_cov_equals_the_dense_formula(n):
    K, tau, nu = _problem(n)
    post = SitePosterior(K, tau, nu, np.zeros(n))
    dense = np.linalg.inv(np.linalg.inv(K) + np.diag(tau)) if n < 300 else \
        K - K @ np.linalg.solve(K + np.diag(1.0 / np.maximum(tau, 1e-300)), K)
    lower = post.lower_cov()
    # 1e-9: K has condition ~1e8 at n = 300 only through the jitter; Σ's entries are O(1)
    assert np.allclose(np.tril(lower), np.tril(dense), atol=1e-9)
    full = post.cov()
    assert np.array_equal(full, full.T)
    assert np.allclose(full, dense, atol=1e-9)


@pytest.mark.parametrize("n,block", [(1, 4), (10, 3), (257, 256), (600, 256)])
def test_mirror_lower_copies_the_strict_lower_triangle(n, block):
    A = np.random.default_rng(n).normal(size=(n, n))
    expected = np.tril(A) + np.tril(A, -1).T
    assert np.array_equal(mirror_lower(A, block=block), expected)
