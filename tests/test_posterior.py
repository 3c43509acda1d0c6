"""SitePosterior's covariance, written without an n x n product temporary (issue 16's memory budget), and
the inverse-factor posterior of the parallel schedule with the gpc._lapack calls it rests on."""

import numpy as np
import pytest

from gpc import _lapack
from gpc._linalg import mirror_lower
from gpc.posterior import InverseFactorPosterior, SitePosterior


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


# -- the inverse-factor posterior the parallel schedule leaves (issue 16) -------------------------

def _inverse_factor_posterior(post):
    Linv = post.L.copy()
    assert _lapack.triangular_inverse_in_place(Linv) == 0
    return InverseFactorPosterior.from_inverse_factor(
        post.K, post.site_precision, post.site_location, post.prior_mean, Linv, post.alpha.copy(),
        post.mean.copy(), post.diag_cov().copy())


@pytest.mark.parametrize("n", [1, 7, 300])
def test_inverse_factor_posterior_equals_the_site_posterior(n):
    # everything from L⁻¹ (dlauum, triangular products, its diagonal) against the same quantities
    # from L; B has eigenvalues in [1, 1 + 3 λmax(K)] (≲ 1e3), so the two routes agree to ~1e-12
    K, tau, nu = _problem(n)
    m0 = np.full(n, 0.3)
    ref = SitePosterior(K, tau, nu, m0)
    post = _inverse_factor_posterior(SitePosterior(K, tau, nu, m0))
    np.testing.assert_allclose(post.L, ref.L, atol=1e-12)
    assert abs(post.log_det_B - ref.log_det_B) < 1e-9
    np.testing.assert_allclose(post.B_inverse(), ref.B_inverse(), atol=1e-12)
    np.testing.assert_allclose(post.R(), ref.R(), atol=1e-11)
    M = post.gradient_matrix()
    np.testing.assert_allclose(M, ref.gradient_matrix(), atol=1e-11)
    assert np.array_equal(M, M.T)
    np.testing.assert_allclose(np.tril(post.lower_cov()), np.tril(ref.lower_cov()), atol=1e-11)
    np.testing.assert_allclose(post.cov(), ref.cov(), atol=1e-11)
    rng = np.random.default_rng(1)
    K_cross, k_diag = rng.uniform(0.0, 1.0, size=(n, 5)), np.full(5, 1.5)
    for got, want in zip(post.predict(K_cross, k_diag, 0.1), ref.predict(K_cross, k_diag, 0.1)):
        np.testing.assert_allclose(got, want, atol=1e-11)


def test_lapack_products_and_solves_against_numpy():
    rng = np.random.default_rng(3)
    n = 9
    A = rng.normal(size=(n, n))
    B = A @ A.T + n * np.eye(n)
    L = np.linalg.cholesky(B)
    Linv = np.linalg.inv(L)
    x = rng.normal(size=n)
    out = np.empty(n)
    _lapack.matvec(A[:4], x, out[:4])                       # rectangular, C order
    np.testing.assert_allclose(out[:4], A[:4] @ x, atol=1e-12)
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-4)):
        b = x.astype(dtype)
        _lapack.cholesky_solve_in_place(L.astype(dtype), b)
        np.testing.assert_allclose(b, np.linalg.solve(B, x), atol=tol)
        rows = rng.normal(size=(3, n))
        for transpose in (False, True):
            got = rows.astype(dtype)
            _lapack.multiply_triangular_rows(Linv.astype(dtype), got, transpose)
            np.testing.assert_allclose(got, rows @ (Linv if transpose else Linv.T), atol=tol)
    T = np.tril(Linv).copy()
    assert _lapack.inverse_factor_gram_in_place(T) == 0
    np.testing.assert_allclose(np.tril(T), np.tril(np.linalg.inv(B)), atol=1e-12)


def test_lapack_entry_points_refuse_mismatched_shapes():
    with pytest.raises(ValueError, match="matvec"):
        _lapack.matvec(np.eye(3), np.ones(2), np.empty(3))
    with pytest.raises(ValueError, match="matvec"):
        _lapack.matvec(np.eye(3), np.ones(3), np.empty(2))
    with pytest.raises(ValueError, match="length 2"):
        _lapack.cholesky_solve_in_place(np.eye(3), np.ones(2))
    with pytest.raises(ValueError, match="rows have length 2"):
        _lapack.multiply_triangular_rows(np.eye(3), np.ones((1, 2)), False)
    with pytest.raises(ValueError, match="square"):
        _lapack.inverse_factor_gram_in_place(np.ones((2, 3)))


def test_row_gram_lower_writes_the_lower_triangle_of_B_Bt():
    rng = np.random.default_rng(4)
    B = rng.normal(size=(6, 3))
    C = np.full((6, 6), np.nan)                       # uninitialised: beta = 0 must not read it
    _lapack.row_gram_lower(B, C)
    np.testing.assert_allclose(np.tril(C), np.tril(B @ B.T), atol=1e-13)
    Z = np.full((4, 4), np.nan)
    _lapack.row_gram_lower(np.empty((4, 0)), Z)       # no columns: the zero matrix
    assert np.array_equal(np.tril(Z), np.zeros((4, 4)))
    with pytest.raises(ValueError, match="rows"):
        _lapack.row_gram_lower(B, np.empty((5, 5)))
