"""The once-per-step m x m work of the sparse engine on threads: the congruences by fixed column
panels, and side tasks (gpc._parallel.defer) beside the blocks of rows; the same bits whatever
``n_jobs``."""

import threading

import numpy as np
import pytest

from gpc import SparseGaussianProcessClassifier, _lapack, _parallel
from gpc.sparse.core.natural import NaturalPosterior, transform_natural

RNG = np.random.default_rng(11)


def _lower(m, scale=3.0):
    return np.tril(RNG.standard_normal((m, m))) + scale * np.eye(m)


def _symmetric(m):
    S = RNG.standard_normal((m, m))
    return S + S.T


# -- the column panels -----------------------------------------------------------------------
@pytest.mark.parametrize("m", [1, 2, 50, 150, 200, 257, 1000])
def test_column_panels_cover_the_columns_with_equal_trailing_work(m):
    work = m ** 3 / 2
    panels = _parallel.column_panels(m, work)
    assert panels[0][0] == 0 and panels[-1][1] == m
    assert all(a < b and b == c for (a, b), (c, _) in zip(panels, panels[1:] + ((m, m),)))
    assert 1 <= len(panels) <= _parallel.MAX_BLOCKS
    assert len(panels) == max(1, min(round(work / _parallel.PANEL_WORK), _parallel.MAX_BLOCKS, m))
    # column j costs ~(m - j)²: each panel's share of Σ (m - j)² is 1/count up to the rounding of
    # its edges to whole columns (one column moves a panel's share by at most 3/m)
    if len(panels) > 1:
        share = [((m - a) ** 3 - (m - b) ** 3) / m ** 3 for a, b in panels]
        np.testing.assert_allclose(share, 1 / len(panels), atol=3 / m + 1e-12)
    with _parallel.block_threads(3):                 # the threads do not enter
        assert _parallel.column_panels(m, work) == panels
    assert _parallel.column_panels(0, work) == ()


# -- the congruence M^T S M ----------------------------------------------------------------------
@pytest.mark.parametrize("m", [1, 5, 33, 150, 200, 257])
def test_congruence_matches_numpy_and_is_exactly_symmetric(m):
    M, S = _lower(m), _symmetric(m)
    garbage = M + np.triu(RNG.standard_normal((m, m)), 1)   # its strict upper triangle is not read
    with _parallel.block_threads(1):
        X = S.copy()
        out = _lapack.congruence(garbage, X)
    assert out is not None
    expect = M.T @ S @ M
    # sums of m products of entries ~3: relative rounding ~m eps
    np.testing.assert_allclose(X, expect, rtol=0, atol=1e-14 * m * np.max(np.abs(expect)))
    np.testing.assert_array_equal(X, X.T)
    # the out= form computes the same bits and leaves S alone
    S0 = S.copy()
    with _parallel.block_threads(1):
        Y = _lapack.congruence(garbage, S, np.empty((m, m)))
    np.testing.assert_array_equal(Y, X)
    np.testing.assert_array_equal(S, S0)


@pytest.mark.parametrize("m", [150, 200, 300])
def test_congruence_is_the_same_bits_on_every_number_of_threads(m):
    M, S = _lower(m), _symmetric(m)
    results = []
    for threads in (1, 2, 3):
        with _parallel.block_threads(threads):
            results.append(_lapack.congruence(M, S, np.empty((m, m))))
    assert len(_parallel.column_panels(m, m ** 3 / 2)) > 1
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


def test_congruence_panels_go_to_the_threads(monkeypatch):
    # a panel on the calling thread waits (at most 10 s) until a pool thread has taken one, so the
    # test does not depend on which thread wins the race on a busy machine; a pass that never
    # reaches the pool times out and fails the assertion
    m = 200
    seen = []
    caller = threading.get_ident()
    pool_took_one = threading.Event()
    original = _parallel.over_blocks

    def spy(fn, n_blocks):
        ran = set()

        def block(j):
            ran.add(threading.get_ident())
            if threading.get_ident() == caller:
                pool_took_one.wait(10.0)
            else:
                pool_took_one.set()
            return fn(j)
        out = original(block, n_blocks)
        seen.append((n_blocks, ran))
        return out
    monkeypatch.setattr(_parallel, "over_blocks", spy)
    M, S = _lower(m), _symmetric(m)
    with _parallel.block_threads(2):
        _lapack.congruence(M, S, np.empty((m, m)))
    assert [n for n, _ in seen] == [len(_parallel.column_panels(m, m ** 3 / 2))] == [4]
    assert seen[0][1] - {caller}


def test_congruence_checks_its_panel():
    with pytest.raises(ValueError, match="columns 3:9 are not inside 0:5"):
        _lapack.congruence_panel(np.eye(5), np.eye(5), np.empty((5, 5)), 3, 9)
    S = np.eye(5)
    with pytest.raises(ValueError, match="X must not be S"):
        _lapack.congruence_panel(np.eye(5), S, S, 0, 5)
    with pytest.raises(ValueError, match="out has 4 columns"):
        _lapack.congruence(np.eye(5), np.eye(5), np.empty((4, 4)))


def test_transform_natural_is_the_congruence_and_keeps_q_symmetric():
    # P' = I + Mᵀ(P - I)M with M = L⁻¹L' (SEP §2.3: the sites fixed in u-space)
    m = 150
    L_old, L_new = _lower(m, 5.0), _lower(m, 5.0)
    B = RNG.standard_normal((m, m))
    P = np.eye(m) + B @ B.T / m
    h = RNG.standard_normal(m)
    Li = np.ascontiguousarray(np.linalg.inv(L_old))
    P_new, h_new = transform_natural(P, h, Li, L_new)
    M = Li @ L_new
    expect = np.eye(m) + M.T @ (P - np.eye(m)) @ M
    np.testing.assert_allclose(P_new, expect, rtol=0, atol=1e-12 * np.max(np.abs(expect)))
    np.testing.assert_array_equal(P_new, P_new.T)
    np.testing.assert_allclose(h_new, M.T @ h, rtol=1e-12, atol=1e-12)


# -- side tasks ------------------------------------------------------------------------------------
def test_a_side_task_runs_beside_the_next_pass_once():
    calls = []
    with _parallel.block_threads(2):
        task = _parallel.defer(lambda: calls.append(threading.get_ident()) or 42)
        assert calls == []
        assert _parallel.over_blocks(lambda j: j, 3) == [0, 1, 2]
        assert len(calls) == 1                   # run by that pass, on one of its threads
        assert task.result() == 42 and len(calls) == 1
        _parallel.over_blocks(lambda j: j, 3)
        assert len(calls) == 1                   # not again


def test_a_side_task_without_a_pass_runs_at_its_result_and_errors_reach_it():
    def fail():
        raise ArithmeticError("side task")

    for threads in (1, 3):
        with _parallel.block_threads(threads):
            values = []
            task = _parallel.defer(lambda: values.append(1) or "done")
            assert values == [] and task.result() == "done" and values == [1]
            bad = _parallel.defer(fail)
            assert _parallel.over_blocks(lambda j: -j, 2) == [0, -1]   # the blocks are not hurt
            with pytest.raises(ArithmeticError, match="side task"):
                bad.result()
            later = _parallel.defer(lambda: values.append(2))
            _parallel.flush()
            assert values == [1, 2] and later.result() is None


def test_on_one_thread_side_tasks_run_before_the_blocks_in_order():
    order = []
    with _parallel.block_threads(1):
        _parallel.defer(lambda: order.append("a"))
        _parallel.defer(lambda: order.append("b"))
        _parallel.over_blocks(lambda j: order.append(j), 2)
    assert order == ["a", "b", 0, 1]


def test_a_prefetched_covariance_goes_to_its_first_reader():
    m = 40
    B = RNG.standard_normal((m, m))
    q = NaturalPosterior(np.eye(m) + B @ B.T / m, RNG.standard_normal(m))
    with _parallel.block_threads(1):              # BLAS on one thread, as in a fit
        fresh = q.cov
    with _parallel.block_threads(2):
        q.prefetch_cov()
        _parallel.over_blocks(lambda j: j, 2)
        first = q.cov
        np.testing.assert_array_equal(first, fresh)
        first += 1.0                              # the reader's own array
        np.testing.assert_array_equal(q.cov, fresh)
    # Σ_w = P⁻¹, to the rounding of a factor of a matrix with condition ~10
    np.testing.assert_allclose(fresh, np.linalg.inv(q.P), rtol=1e-12, atol=1e-13)


# -- a fit on the panels and side tasks --------------------------------------------------------
def test_a_minibatch_fit_at_200_inducing_points_is_the_same_bits_for_every_n_jobs():
    # m = 200: the congruences run as 4 column panels, the step's side tasks (the prior term's
    # Σ_w, the copy of the new directions into V) beside the evidence's blocks; two epochs, so
    # that the second swaps the sites kept in V
    rng = np.random.default_rng(5)
    X = rng.standard_normal((1200, 3))
    y = np.where(np.sin(X[:, 0]) + X[:, 1] * X[:, 2] + 0.3 * rng.standard_normal(1200) > 0, 1, 0)
    X_test = rng.standard_normal((300, 3))
    fits = []
    for n_jobs in (1, 2, 3):
        clf = SparseGaussianProcessClassifier(n_inducing=200, batch_size=200, max_iter=2,
                                              random_state=0, progress=False, n_jobs=n_jobs)
        fits.append(clf.fit(X, y))
    base = fits[0]
    for clf in fits[1:]:
        for a, b in zip(clf.predict_latent(X_test), base.predict_latent(X_test)):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(clf.predict_proba(X_test), base.predict_proba(X_test))
        np.testing.assert_array_equal(clf.kernel_.theta, base.kernel_.theta)
        assert clf.log_marginal_likelihood_value_ == base.log_marginal_likelihood_value_
