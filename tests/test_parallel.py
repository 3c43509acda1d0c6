"""The O(n²) passes shared out among threads (gpc._parallel): every row range covered once, the
same bits with one thread and with several, and the values of the dense formulas they implement."""

import numpy as np
import pytest

from gpc import _dense, _kernels, _parallel
from gpc.kernels import RBF, ConstantKernel, Matern

N = 700          # above MIN_ROWS: the passes are split into ranges
assert N >= _parallel.MIN_ROWS


@pytest.mark.parametrize("cost", ["rows", "lower", "upper"])
@pytest.mark.parametrize("n", [0, 1, 511, 512, 513, 2000])
def test_ranges_cover_every_row_once(cost, n):
    ranges = _parallel.row_ranges(n, cost)
    rows = np.concatenate([np.arange(a, b) for a, b in ranges]) if ranges else np.array([])
    assert np.array_equal(rows, np.arange(n))


def test_ranges_share_the_work_equally():
    # row i of a lower triangle costs i + 1 entries; each of the 8 ranges gets 1/8 of them to
    # within one row's worth (the boundaries are rounded to whole rows)
    n = 2000
    for cost, work in [("lower", np.arange(1, n + 1)), ("upper", np.arange(n, 0, -1)),
                       ("rows", np.ones(n))]:
        shares = [work[a:b].sum() / work.sum() for a, b in _parallel.row_ranges(n, cost)]
        assert len(shares) == _parallel.N_RANGES
        assert max(abs(s - 1 / _parallel.N_RANGES) for s in shares) < work.max() / work.sum() * 1.01


@pytest.fixture(params=[1, 2, 3], ids=lambda t: f"{t} threads")
def threads(request, monkeypatch):
    monkeypatch.setattr(_parallel, "blas_now", lambda: request.param)
    return request.param


def _data(d, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, d))


def _sqdist(X, Y):
    return ((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1)


@pytest.mark.parametrize("d", [3, 12], ids=["direct", "gram"])
@pytest.mark.parametrize("kernel", ["rbf", "matern32"])
def test_kernel_matrix_equals_the_dense_formula(threads, d, kernel):
    X = _data(d)
    k = ConstantKernel(1.7) * (RBF(1.3) if kernel == "rbf" else Matern(1.3, nu=1.5))
    r = np.sqrt(_sqdist(X, X)) / 1.3
    want = 1.7 * (np.exp(-0.5 * r ** 2) if kernel == "rbf"
                  else (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r))
    K = k(X)
    # 1e-12: the Gram-matrix route's |u|² + |v|² - 2u·v cancels to ~1e-15 of |u|², times O(1)
    np.testing.assert_allclose(K, want, rtol=0, atol=1e-12)
    assert np.array_equal(K, K.T)
    Xs = X[:50]
    np.testing.assert_allclose(k(X, Xs), want[:, :50], rtol=0, atol=1e-12)


def test_passes_give_the_same_bits_for_any_number_of_threads(monkeypatch):
    X = _data(4)
    k = ConstantKernel(0.8) * RBF(np.array([0.5, 1.0, 2.0, 1.5]))
    rng = np.random.default_rng(1)
    M = rng.normal(size=(N, N))
    M = M + M.T
    results = []
    for t in (1, 2, 3):
        monkeypatch.setattr(_parallel, "blas_now", lambda t=t: t)
        K = k(X)
        results.append((K, k._contract(X, M, K=K / 0.8, symmetric=True), k._contract(X, M)))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b)


def test_fill_b_and_gradient_matrix_equal_their_formulas(threads):
    rng = np.random.default_rng(2)
    A = rng.normal(size=(N, N))
    K = A @ A.T / N
    s, a, u, g = (rng.uniform(0.1, 1.0, N) for _ in range(4))
    B = np.zeros((N, N))
    _parallel.over_rows(_dense.fill_b, N, K, s, B)
    want = np.eye(N) + s[:, None] * K * s[None, :]
    np.testing.assert_array_equal(np.tril(B), np.tril(want))    # one rounding each: exact

    B_inv = np.linalg.inv(want)
    M = B_inv.copy()
    _parallel.over_rows(_dense.gaussian_site_gradient_matrix, N, M, s, a, u, g, True)
    want_M = 0.5 * (np.outer(a, a) - s[:, None] * B_inv * s[None, :] + np.outer(u, g)
                    + np.outer(g, u))
    np.testing.assert_allclose(M, want_M, rtol=1e-14, atol=1e-14)
    assert np.array_equal(M, M.T)


def test_column_sums_of_squares(threads):
    rng = np.random.default_rng(3)
    T = np.tril(rng.normal(size=(N, N)))
    out = np.full(N, np.nan)
    _parallel.over_rows(_dense.column_sq_sums_lower, N, T, out, cost="upper")
    np.testing.assert_allclose(out, (T ** 2).sum(axis=0), rtol=1e-13)


def test_the_gradient_contraction_equals_the_dense_formula(threads):
    X = _data(10)
    ls = np.linspace(0.8, 2.0, 10)
    k = RBF(ls)
    rng = np.random.default_rng(4)
    M = rng.normal(size=(N, N))
    K = k(X)
    D2 = (X[:, None, :] - X[None, :, :]) ** 2 / ls ** 2      # ∂K/∂log l_d = K (x_d - x'_d)² / l_d²
    want = np.einsum("ij,ij,ijd->d", M, K, D2)
    np.testing.assert_allclose(k._contract(X, M), want, rtol=1e-10)


def test_a_range_outside_the_matrix_is_refused():
    K = np.eye(4)
    with pytest.raises(ValueError, match="row range"):
        _dense.fill_b(K, np.ones(4), np.empty((4, 4)), start=3, stop=5)
    with pytest.raises(ValueError, match="row range"):
        _kernels.finish_kernel(K, 1.0, start=2, stop=1)


def test_blas_threads_follow_threadpoolctl():
    import threadpoolctl
    from gpc import _threads
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        assert _threads.blas_now() == 1


def test_threads_other_than_the_main_one_run_passes_inline():
    from concurrent.futures import ThreadPoolExecutor
    from gpc import _threads
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(_threads.blas_now).result() == 1
