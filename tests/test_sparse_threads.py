"""The sparse engine on threads (gpc._parallel's blocks): the same bits whatever ``n_jobs``, the
threads really used, BLAS on one thread inside them, and the blocks' algebra against NumPy."""

import multiprocessing
import threading
import time

import numpy as np
import pytest

from gpc import SparseGaussianProcessClassifier, SparseMultiClassGPC, _parallel, _sparse
from gpc._estimator import available_cores
from gpc.kernels import RBF, ConstantKernel
from gpc.likelihoods import get_likelihood
from gpc.sparse.core.natural import NaturalPosterior, add_blocks, whitened_sums


def _problem(n=3000, d=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    f = np.sin(X[:, 0]) + X[:, 1] * X[:, 2]
    y = np.where(f + 0.3 * rng.standard_normal(n) > 0, 1, 0)
    return X, y


X, Y = _problem()
X_TEST, _ = _problem(500, seed=1)

# every trainer and site form: per-row sites (EP, PL) in minibatches and in batch, tied sites,
# SVI in minibatches and in batch (L-BFGS-B), GFITC; three classes one-vs-rest once
CASES = {
    "ep minibatch": dict(batch_size=400, max_iter=2),
    "ep batch": dict(batch_size=None, max_iter=3),
    "pl minibatch": dict(method="pl", batch_size=400, max_iter=2),
    "ep tied": dict(tied_sites=True, batch_size=400, max_iter=2),
    "svi minibatch": dict(method="svi", batch_size=400, max_iter=2),
    "svi batch": dict(method="svi", batch_size=None, max_iter=3),
    "gfitc": dict(method="gfitc", batch_size=None, max_iter=2, on_negative="skip"),
    # the default kernel's compiled chunks (GIL released) several to a minibatch: 3 of 500 rows
    "ep minibatch, kernel chunks": dict(batch_size=1500, n_inducing=100, max_iter=2),
    "svi minibatch, kernel chunks": dict(method="svi", batch_size=1500, n_inducing=100,
                                         max_iter=2),
}


def _fit(n_jobs, y=Y, **options):
    options.setdefault("n_inducing", 60)
    clf = SparseGaussianProcessClassifier(random_state=0, progress=False, n_jobs=n_jobs, **options)
    return clf.fit(X, y)


@pytest.mark.parametrize("case", sorted(CASES))
def test_predictions_are_the_same_bits_for_every_n_jobs(case):
    # fixed blocks and panels, sums in row order: 2 and 3 threads give one thread's bits exactly
    # (not merely to rounding); the latent moments and the fitted θ too
    fits = [_fit(n_jobs, **CASES[case]) for n_jobs in (1, 2, 3)]
    base = fits[0].predict_latent(X_TEST)
    for clf in fits[1:]:
        for a, b in zip(clf.predict_latent(X_TEST), base):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(clf.kernel_.theta, fits[0].kernel_.theta)
        assert clf.log_marginal_likelihood_value_ == fits[0].log_marginal_likelihood_value_


def test_one_vs_rest_and_partial_fit_after_a_threaded_fit_match_one_thread():
    y3 = np.digitize(X[:, 0] + 0.5 * X[:, 1], [-0.5, 0.5])
    runs = []
    for n_jobs in (1, 2):
        clf = _fit(n_jobs, y=y3, batch_size=500, max_iter=1)
        clf.partial_fit(X, y3)
        runs.append(clf.predict_proba(X_TEST))
        assert clf.n_iter_ == 2
    np.testing.assert_array_equal(runs[0], runs[1])



@pytest.mark.parametrize("case", ["ep minibatch", "ep tied", "multi-class"])
def test_fits_are_the_same_bits_whatever_threads_blas_may_use(case):
    # the model's first K_uu factors are taken with BLAS pinned as every later one: a caller's
    # BLAS limit (threadpoolctl, OPENBLAS_NUM_THREADS) changes n_jobs=None's threads, not the
    # fit (OpenBLAS's threaded Cholesky of K_uu differs from its one-thread one in the last bits,
    # which a minibatch fit grew to 6e-7 in the latent mean at m = 200 before)
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if available_cores() < 2:
        pytest.skip("one core: BLAS has one thread either way")
    y3 = np.digitize(X[:, 0] + 0.5 * X[:, 1], [-0.5, 0.5])
    runs = []
    for limit in (1, 2):
        with threadpoolctl.threadpool_limits(limits=limit, user_api="blas"):
            if case == "multi-class":
                clf = SparseMultiClassGPC(n_inducing=200, batch_size=500, max_iter=1,
                                          random_state=0, progress=False, n_jobs=1).fit(X, y3)
            else:
                clf = _fit(1, n_inducing=200, **CASES[case])
        runs.append(clf.predict_proba(X_TEST))
    np.testing.assert_array_equal(runs[0], runs[1])

def test_predictions_do_not_depend_on_n_jobs_at_predict_time():
    clf = _fit(1, batch_size=400, max_iter=1)
    p1 = clf.predict_proba(X_TEST)
    clf.set_params(n_jobs=3)
    np.testing.assert_array_equal(clf.predict_proba(X_TEST), p1)


class _Spy:
    """Wraps gpc._parallel.over_blocks: records each pass's blocks, the threads it was given, the
    threads its blocks ran on and the BLAS threads seen inside a block."""

    def __init__(self, monkeypatch):
        self.calls = []
        original = _parallel.over_blocks
        info = _blas_threads_probe()
        caller, pool_took_one = threading.get_ident(), threading.Event()

        def spy(fn, n_blocks):
            ran, blas = set(), []
            shared = _parallel.threads_now() > 1 and n_blocks > 1

            def block(j):
                ran.add(threading.get_ident())
                blas.append(info())
                # the caller's blocks of a shared pass wait (at most 10 s) until the pool has
                # taken one, so a busy machine cannot leave every block to the caller
                if threading.get_ident() != caller:
                    pool_took_one.set()
                elif shared:
                    pool_took_one.wait(10.0)
                return fn(j)
            out = original(block, n_blocks)
            self.calls.append((n_blocks, _parallel.threads_now(), ran, blas))
            return out
        monkeypatch.setattr(_parallel, "over_blocks", spy)


def _blas_threads_probe():
    """A function returning the most threads of any BLAS library loaded (threadpoolctl)."""
    from gpc import _threads
    controller = _threads.controller()

    def probe():
        return max(lib.num_threads for lib in controller.lib_controllers if lib.user_api == "blas")
    return probe


def test_the_blocks_go_to_the_threads_with_blas_pinned_inside(monkeypatch):
    spy = _Spy(monkeypatch)
    before = _blas_threads_probe()()
    _fit(2, batch_size=750, max_iter=1, n_inducing=150)
    # every minibatch step shares its rows out (750 rows x 150² is 8 blocks of
    # gpc._parallel.BLOCK_WORK): the whitening, the site update with its sums and the evidence
    # with its gradient are passes of more than one block, on 2 threads
    shared = [c for c in spy.calls if c[0] > 1 and c[1] == 2]
    assert len(shared) >= 3 * (3000 // 750)
    # the pool's thread took blocks (its blocks ran on a thread other than the caller's)
    callers = {threading.get_ident()}
    assert any(ran - callers for _, _, ran, _ in shared)
    # inside every block BLAS ran on one thread; outside the fit BLAS has its threads back
    assert all(b == 1 for _, _, _, blas in spy.calls for b in blas)
    assert _blas_threads_probe()() == before


def test_one_thread_runs_every_block_in_the_caller(monkeypatch):
    spy = _Spy(monkeypatch)
    _fit(1, batch_size=800, max_iter=1)
    assert spy.calls and all(ran == {threading.get_ident()} for _, _, ran, _ in spy.calls)
    assert all(threads == 1 for _, threads, _, _ in spy.calls)


def test_n_jobs_none_follows_blas_limits():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    # a step's pass of 800 rows x 100² is past the thread policy's BLOCK_THREADS_FROM
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        clf = _fit(None, batch_size=800, max_iter=1, n_inducing=100)
    assert clf._trainer.n_jobs == 1
    assert _fit(-1, batch_size=800, max_iter=1, n_inducing=100)._trainer.n_jobs == available_cores()
    assert _fit(3, batch_size=800, max_iter=1, n_inducing=100)._trainer.n_jobs == 3
    # below it the engine runs on one thread whatever n_jobs asks (gpc._threads.engine_threads)
    assert _fit(3, batch_size=200, max_iter=1, n_inducing=60)._trainer.n_jobs == 1


# -- the runner and the fixed cuts ---------------------------------------------------------------
def test_over_blocks_returns_in_order_and_raises_the_first_error():
    with _parallel.block_threads(3):
        assert _parallel.over_blocks(lambda j: j * j, 20) == [j * j for j in range(20)]

        def fail(j):
            if j in (5, 11):
                raise ValueError(f"block {j}")
            return j
        with pytest.raises(ValueError, match="block 5"):
            _parallel.over_blocks(fail, 20)
        # a block runs its nested passes in its own thread
        assert _parallel.over_blocks(lambda j: _parallel.threads_now(), 4) == [1] * 4
    assert _parallel.threads_now() == 1


def test_over_blocks_every_block_runs_once_while_helpers_lag():
    # helpers take passes late or not at all (one shared queue): every block still runs exactly
    # once and the pass returns only after the slow blocks that helpers took have ended
    ran = []
    with _parallel.block_threads(4):
        for n in (1, 2, 3, 7, 16, 5, 2):
            def fn(j, n=n):
                if j % 3 == 1:
                    time.sleep(0.002)      # GIL released: another thread takes the next block
                ran.append((n, j))
                return n * 100 + j
            assert _parallel.over_blocks(fn, n) == [n * 100 + j for j in range(n)]
            assert sorted(j for m, j in ran if m == n) == list(range(n))
            ran.clear()


class _Abort(BaseException):
    """Not an Exception: what a block raising SystemExit or a KeyboardInterrupt looks like."""


def test_over_blocks_hands_a_helpers_base_exception_to_the_caller():
    # a block that raises a BaseException on a helper thread must not end that thread silently
    # and leave its block's result None: the caller raises it, and the helpers keep serving
    helper_ran = threading.Event()

    def fn(j):
        if threading.current_thread() is not threading.main_thread():
            helper_ran.set()
            raise _Abort(f"block {j}")
        helper_ran.wait(10.0)          # bounded: the helper takes a block while the caller waits
        return j
    with _parallel.block_threads(2):
        with pytest.raises(_Abort, match="block"):
            _parallel.over_blocks(fn, 4)
        assert _parallel.over_blocks(lambda j: j * 2, 6) == [0, 2, 4, 6, 8, 10]
        seen = set()

        def where(j):
            seen.add(threading.get_ident())
            time.sleep(0.002)
            return j
        for _ in range(20):                 # bounded: a helper still takes blocks
            _parallel.over_blocks(where, 8)
            if len(seen) > 1:
                break
        assert len(seen) > 1


def _blocks_in_child(conn):
    with _parallel.block_threads(2):
        conn.send(_parallel.over_blocks(lambda j: j + 1, 4))


def test_over_blocks_in_a_forked_child_has_its_own_helpers():
    # a child made by fork has none of the parent's helper threads: it must start its own, not
    # post to the parent's queue and wait (bounded: a hang fails the test after 60 s)
    with _parallel.block_threads(2):
        assert _parallel.over_blocks(lambda j: j, 4) == [0, 1, 2, 3]     # the parent's helpers
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_blocks_in_child, args=(child,))
    proc.start()
    try:
        assert parent.poll(60), "over_blocks hung in a forked child"
        assert parent.recv() == [1, 2, 3, 4]
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


@pytest.mark.parametrize("n, work", [(1, 10**9), (200, 40_000), (2000, 40_000), (20_000, 40_000),
                                     (4096, 400), (7, 1)])
def test_row_blocks_cover_the_rows_in_at_most_max_blocks(n, work):
    blocks = _parallel.row_blocks(n, work)
    assert blocks[0][0] == 0 and blocks[-1][1] == n
    assert all(a < b and b == c for (a, b), (c, _) in zip(blocks, blocks[1:] + ((n, n),)))
    assert 1 <= len(blocks) <= _parallel.MAX_BLOCKS
    sizes = [b - a for a, b in blocks]
    assert max(sizes) - min(sizes) <= 1
    assert _parallel.row_blocks(0, work) == ()


@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("m, work", [(200, 1.3e6), (200, 10), (37, 1e9), (3, 1e9)])
def test_row_stripes_cover_the_rows(m, work, lower):
    stripes = _parallel.row_stripes(m, work, lower)
    assert stripes[0][0] == 0 and stripes[-1][1] == m
    assert all(b == c and a < b for (a, b), (c, _) in zip(stripes, stripes[1:] + ((m, m),)))
    assert len(stripes) <= _parallel.MAX_BLOCKS


# -- the blocks' algebra against NumPy -------------------------------------------------------------
RNG = np.random.default_rng(3)


def _rows(k, m):
    return np.ascontiguousarray(RNG.standard_normal((k, m)))


@pytest.mark.parametrize("lower", [False, True])
def test_add_blocks_adds_in_block_order(lower):
    parts = RNG.standard_normal((7, 30, 30))
    out = np.ones((30, 30))
    with _parallel.block_threads(3):
        add_blocks(parts, out, lower)
    expect = np.ones((30, 30))
    for part in parts:                       # block by block: the same additions, the same bits
        expect += part
    mask = np.tril(np.ones((30, 30), bool)) if lower else np.ones((30, 30), bool)
    np.testing.assert_array_equal(out[mask], expect[mask])
    np.testing.assert_array_equal(out[~mask], 1.0)


def test_whitened_sums_keep_signs_of_the_weights():
    A = _rows(500, 40)
    tau = RNG.standard_normal(500)          # negative sites too (EP's "keep")
    nu = RNG.standard_normal(500)
    dP, dh = whitened_sums(A, tau, nu)
    np.testing.assert_allclose(dP, A.T @ (tau[:, None] * A), rtol=0, atol=1e-11)
    np.testing.assert_allclose(dh, A.T @ nu, rtol=0, atol=1e-11)


def _posterior(m):
    S = _rows(m, m)
    return NaturalPosterior(np.eye(m) + S @ S.T / m, RNG.standard_normal(m))


def test_marginals_by_blocks_match_numpy():
    q = _posterior(30)
    A = _rows(3000, 30)
    Sigma = np.linalg.inv(q.P)
    with _parallel.block_threads(2):
        mean, var, B = q.moments(A)
    np.testing.assert_allclose(mean, A @ np.linalg.solve(q.P, q.h), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(var, np.einsum("ij,jk,ik->i", A, Sigma, A), rtol=1e-10)
    np.testing.assert_allclose(B, A @ Sigma, rtol=1e-9, atol=1e-12)


def _block_problem(m, k):
    """A refine_block problem: the probit likelihood, q, k rows A, labels y and a factor L."""
    A = _rows(k, m)
    y = np.where(RNG.random(k) > 0.5, 1.0, -1.0)
    L = np.linalg.cholesky(np.eye(m) + 0.1 * np.ones((m, m)))
    return get_likelihood("probit"), _posterior(m), A, y, L


def test_refine_block_sums_match_numpy_and_fresh_rows_swap_as_new_sites():
    # the block's sums against NumPy; and a block whose rows have no site yet gives the same bits
    # in SUMS_SWAP (old sites removed along a') as in SUMS_NEW, so blocks may take either path
    m, k = 12, 50
    lik, q, A, y, L = _block_problem(m, k)
    s = RNG.random(k)
    zero = np.zeros(k)
    out = {}
    for mode in (_sparse.SUMS_NEW, _sparse.SUMS_SWAP):
        t, n, dP, dh = np.empty(k), np.empty(k), np.full((m, m), np.nan), np.empty(m)
        extra = (np.zeros((k, m), np.float32), L) if mode == _sparse.SUMS_SWAP else ()
        status = _sparse.refine_block(*lik.compiled_spec(), 0, 4, 1.0, mode, y, A, s, q.Ri,
                                      q.mean, zero, zero, t, n, dP, dh, *extra)
        assert status[0] == 0
        out[mode] = (t, n, np.tril(dP), dh)
    for a, b in zip(out[_sparse.SUMS_NEW], out[_sparse.SUMS_SWAP]):
        np.testing.assert_array_equal(a, b)
    t, n, dP, dh = out[_sparse.SUMS_NEW]
    # 50 rows of terms of size ~1: rounding far below 1e-12
    np.testing.assert_allclose(dP, np.tril(A.T @ (t[:, None] * A)), rtol=0, atol=1e-12)
    np.testing.assert_allclose(dh, A.T @ n, rtol=0, atol=1e-12)


def test_refine_block_swap_removes_the_old_sites_along_their_directions():
    m, k = 10, 40
    lik, q, A, y, L = _block_problem(m, k)
    tau, nu = RNG.random(k), RNG.standard_normal(k)
    V = RNG.standard_normal((k, m)).astype(np.float32)
    Li = np.ascontiguousarray(np.linalg.inv(L))
    t, n, dP, dh = np.empty(k), np.empty(k), np.empty((m, m)), np.empty(m)
    V_new = np.empty((k, m))
    status = _sparse.refine_block(*lik.compiled_spec(), 0, 4, 1.0, _sparse.SUMS_SWAP, y, A,
                                  RNG.random(k), q.Ri, q.mean, tau, nu, t, n, dP, dh, V, L, Li,
                                  V_new)
    assert status[0] == 0
    A_old = V.astype(np.float64) @ L                            # rows a'_i = Lᵀ v_i
    expect = A.T @ (t[:, None] * A) - A_old.T @ (tau[:, None] * A_old)
    # sums of 80 terms of size ~10: rounding ~1e-13
    np.testing.assert_allclose(np.tril(dP), np.tril(expect), rtol=0, atol=1e-11)
    np.testing.assert_allclose(dh, A.T @ n - A_old.T @ nu, rtol=0, atol=1e-11)
    # the new directions v_i = L⁻ᵀ a_i (10 terms of size ~1: rounding ~1e-15)
    np.testing.assert_allclose(V_new, A @ Li, rtol=0, atol=1e-13)


def test_cavity_gradient_with_directions_is_the_w_space_form_carried_to_u_space():
    # evidence_block's cavity form: ∂F/∂K_bu = (γ_i - 2 g_s a_i)ᵀL⁻¹ row by row either way, and
    # the K_uu part Σ (g_s a_i - γ_i) a_iᵀ (w-space), or with the rows' directions v_i = L⁻ᵀa_i
    # (the minibatch's swap makes them) L⁻ᵀ(that)L⁻¹ (u-space), γ_i = d1 μ + e Σ_w a_i
    # (ep.block_evidence): against those formulas in NumPy, with Σ_w and L⁻¹ explicit
    m, k = 12, 50
    lik, q, A, y, L = _block_problem(m, k)
    Li = np.ascontiguousarray(np.linalg.inv(L))
    RiLi = np.ascontiguousarray(np.tril(q.Ri @ Li))
    # τ_i below 1/|a_i|², which bounds a_iᵀΣ_w a_i (Σ_w ≤ I): every cavity proper
    s, tau, nu = RNG.random(k), 0.02 * RNG.random(k), 0.2 * RNG.standard_normal(k)
    spec = lik.compiled_spec()
    out = []
    for V in (None, np.ascontiguousarray(A @ Li)):
        g_s, G, AtG = np.empty(k), np.empty((k, m)), np.empty((m, m))
        total, bad = _sparse.evidence_block(*spec, 0, True, y, A, s, q.Ri, q.mean, tau, nu, g_s,
                                            G, AtG, Li, RiLi, V)
        assert bad == 0
        out.append((total, G, AtG, g_s))
    Sigma = np.linalg.inv(q.P)
    mean, var = A @ q.mean, np.einsum("ij,jk,ik->i", A, Sigma, A)
    g_ref, d1, e = np.empty(k), np.empty(k), np.empty(k)
    total, _ = _sparse.evidence_rows(*spec, 0, y, mean, var, s, tau, nu, g_ref, d1, e)
    gamma = d1[:, None] * q.mean + e[:, None] * (A @ Sigma)
    G_ref = (gamma - 2.0 * g_ref[:, None] * A) @ Li
    AtG_w = (g_ref[:, None] * A - gamma).T @ A
    for (t, G, AtG, g_s), AtG_ref in zip(out, (AtG_w, Li.T @ AtG_w @ Li)):
        # 50 rows of O(1) terms through m = 12 products: rounding ~1e-13
        assert abs(t - total) < 1e-10
        np.testing.assert_allclose(g_s, g_ref, rtol=0, atol=1e-12)
        np.testing.assert_allclose(G, G_ref, rtol=0, atol=1e-11)
        np.testing.assert_allclose(AtG, AtG_ref, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="needs Li and RiLi"):
        _sparse.evidence_block(*spec, 0, True, y, A, s, q.Ri, q.mean, tau, nu, np.empty(k),
                               np.empty((k, m)), np.empty((m, m)), Li, None, A @ Li)
    with pytest.raises(ValueError, match="V is 3 x 12, the block is 50 x 12"):
        _sparse.evidence_block(*spec, 0, True, y, A, s, q.Ri, q.mean, tau, nu, np.empty(k),
                               np.empty((k, m)), np.empty((m, m)), Li, RiLi, np.ones((3, m)))


def test_a_minibatch_step_takes_the_same_gradient_in_u_space_as_in_w_space():
    # the minibatch step's gradient from the swap's directions (u-space K_uu part) against the
    # same parts without them (w-space, as the shards and tied sites take it): the same θ and Z
    # gradient to rounding (products of m = 20 terms of size ~1-10: 1e-9 relative is rounding)
    from gpc.sparse._passes import block_parts
    from gpc.sparse._train import LocalBatch, SEPState
    from gpc.sparse.core.passes import finish_evidence
    from gpc.sparse.core.steps import _refine_minibatch

    rng = np.random.default_rng(5)
    Xs = rng.standard_normal((300, 3))
    ys = np.where(Xs[:, 0] + 0.3 * rng.standard_normal(300) > 0, 1.0, -1.0)
    lik = get_likelihood("probit")
    state = SEPState(ConstantKernel(1.0) * RBF(1.5), Xs[:20], 300, 1e-8, True, 1.0)
    rows = slice(100, 220)
    batch = LocalBatch(state, lik, Xs[rows], ys[rows], rows)
    _refine_minibatch(state, batch, 1.0)
    state.settle()
    assert batch.u_space
    grads = []
    for u_space in (True, False):
        A, s, Kbu = batch._whitened
        parts = block_parts(lik, Xs[rows], ys[rows], A, s, state.factor, state.q,
                            state.tau[rows], state.nu[rows], True, Kbu, "cavity",
                            directions=batch._directions if u_space else None)
        grads.append(finish_evidence(state.factor, state.q, parts, 2.5, "cavity", u_space)[1:3])
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)



def test_the_u_space_prior_term_is_the_congruence_of_the_w_space_one():
    # prior_term_u = L⁻ᵀ ½(Σ_w + μμᵀ - I) L⁻¹ from two Gram products ((R⁻¹L⁻¹)ᵀ(R⁻¹L⁻¹), L⁻ᵀL⁻¹)
    # and ν = L⁻ᵀμ, against NumPy's congruence of prior_term (m = 15 products of O(1) terms:
    # 1e-12 is rounding); exactly symmetric; its parts prefetched as side tasks or formed on
    # demand, the same bits
    from gpc.sparse.core.inducing import InducingFactor
    from gpc.sparse.core.natural import prior_term, prior_term_u

    m = 15
    Z = np.random.default_rng(3).standard_normal((m, 2))
    factor = InducingFactor(ConstantKernel(1.3) * RBF(0.9), Z, 1e-6)
    q = _posterior(m)
    Li = np.linalg.inv(factor.L)
    expect = Li.T @ prior_term(q) @ Li
    got = prior_term_u(q, factor)
    scale = np.abs(expect).max()
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-12 * scale)
    np.testing.assert_array_equal(got, got.T)
    np.testing.assert_allclose(factor.inverse(), np.linalg.inv(factor.L @ factor.L.T),
                               rtol=0, atol=1e-10 * np.abs(factor.inverse()).max())
    fresh, q2 = InducingFactor(ConstantKernel(1.3) * RBF(0.9), Z, 1e-6), NaturalPosterior(q.P, q.h)
    q2.prefetch_cov(fresh.Li)
    fresh.prefetch_inverse()
    with _parallel.block_threads(2):
        _parallel.over_blocks(lambda j: None, 2)       # a pass the side tasks run beside
    assert q2._cov[1].done and fresh._inverse.done
    np.testing.assert_array_equal(prior_term_u(q2, fresh), got)
    # a prefetch for another factor's L⁻¹ is not taken for this one
    q2.prefetch_cov(np.eye(m))
    np.testing.assert_array_equal(q2.cov_u(fresh.Li), q.cov_u(factor.Li))


def test_the_whitening_inside_the_swap_pass_gives_the_swap_after_a_whitening():
    # swap_block_sites(before=) whitens each block of rows right before its swap (one pass):
    # the same bits as a whitening pass and then the swap, on 1 and 3 threads; the tied sites'
    # match (tied_block_sites(before=)) likewise
    from gpc.sparse._train import swap_block_sites, tied_block_sites
    from gpc.sparse.core.inducing import InducingFactor

    rng = np.random.default_rng(11)
    m, b = 40, 900                       # 900 rows against m = 40: several blocks
    Xb = rng.standard_normal((b, 3))
    yb = np.where(Xb[:, 0] > 0, 1.0, -1.0)
    factor = InducingFactor(ConstantKernel(1.2) * RBF(1.1), Xb[:m], 1e-8)
    lik, q = get_likelihood("probit"), _posterior(m)
    tau, nu = 0.05 * rng.random(b), 0.1 * rng.standard_normal(b)
    V_old = rng.standard_normal((b, m)).astype(np.float32) * 0.1
    runs = []
    for threads in (1, 3):
        for fused in (False, True):
            work = {}

            def workspace(name, shape, work=work):
                return work.setdefault(name, np.empty(shape))
            P, h = q.P.copy(), q.h.copy()
            with _parallel.block_threads(threads):       # BLAS pinned for the kernel's too
                if fused:
                    before, _, (A, s) = factor.whiten_blocks(Xb)
                else:
                    before, (A, s) = None, factor.whiten(Xb)
                out = swap_block_sites(lik, yb, A, s, q, tau, nu, V_old, factor, 1.0, P, h,
                                       workspace, before=before)
            runs.append((A.copy(), s.copy(), out[0], out[1], out[2].copy(), P, h))
    for run in runs[1:]:
        for a, b_ in zip(run, runs[0]):
            np.testing.assert_array_equal(a, b_)
    with pytest.raises(ValueError, match="C-contiguous float64"):
        swap_block_sites(lik, yb, np.asfortranarray(A), s, q, tau, nu, V_old, factor, 1.0,
                         q.P.copy(), q.h.copy(), workspace, before=before)
    # the tied sites' match: the same, and its sums those of the matched sites (whitened_sums)
    tied = []
    for threads in (1, 3):
        for fused in (False, True):
            with _parallel.block_threads(threads):
                if fused:
                    before, _, (A, s) = factor.whiten_blocks(Xb)
                else:
                    before, (A, s) = None, factor.whiten(Xb)
                tied.append(tied_block_sites(lik, yb, A, s, q, before=before))
    for run in tied[1:]:
        for a, b_ in zip(run, tied[0]):
            np.testing.assert_array_equal(a, b_)
    t_m, n_m, dP, dh = tied[0]
    assert np.count_nonzero(t_m) > b // 2
    dP_ref, dh_ref = whitened_sums(A, t_m, n_m)     # 900 terms of size ~0.1-1: rounding 1e-12
    np.testing.assert_allclose(dP, dP_ref, rtol=0, atol=1e-12 * np.abs(dP_ref).max())
    np.testing.assert_allclose(dh, dh_ref, rtol=0, atol=1e-12 * np.abs(dh_ref).max())

def test_block_entry_checks_name_the_problem():
    lik = get_likelihood("probit")
    q = _posterior(5)
    ones = np.ones(4)
    with pytest.raises(ValueError, match="the block is 4 x 5"):
        _sparse.refine_block(*lik.compiled_spec(), 0, 4, 1.0, _sparse.SUMS_SWAP, ones,
                             np.ones((4, 5)), ones, q.Ri, q.mean, ones, ones, np.empty(4),
                             np.empty(4), np.empty((5, 5)), np.empty(5),
                             np.zeros((3, 5), np.float32), np.eye(5))
    with pytest.raises(ValueError, match="SUMS_SWAP needs"):
        _sparse.refine_block(*lik.compiled_spec(), 0, 4, 1.0, _sparse.SUMS_SWAP, ones,
                             np.ones((4, 5)), ones, q.Ri, q.mean, ones, ones, np.empty(4),
                             np.empty(4), np.empty((5, 5)), np.empty(5))
    with pytest.raises(ValueError, match="rows 3:9 are not inside 0:5"):
        _sparse.sum_blocks(np.ones((2, 5, 5)), np.eye(5), 3, 9)
    with pytest.raises(ValueError, match="G and AtG go together"):
        _sparse.evidence_block(*lik.compiled_spec(), 0, True, ones, np.ones((4, 5)), ones, q.Ri,
                               q.mean, ones, ones, np.empty(4), np.empty((4, 5)))


def test_the_kernel_chunks_case_has_several_chunks():
    from gpc.sparse.core import inducing as _inducing

    factor = _inducing.InducingFactor(ConstantKernel(1.0) * RBF(1.0), X[:100])
    assert factor.bound.nogil and len(factor.chunks(1500)) == 3


@pytest.mark.parametrize("compiled", [True, False])
def test_the_kernel_is_called_on_fixed_chunks(monkeypatch, compiled):
    # the squared exponential's compiled chunks (GIL released) are blocks of about BLOCK_WORK;
    # any other kernel's hold the GIL and come in kernel_chunks of >= KERNEL_ROWS rows
    from gpc.kernels import Matern
    from gpc.sparse.core import inducing as _inducing

    sizes = []
    kernel = ConstantKernel(1.5) * (RBF(1.2) if compiled else Matern(1.2))
    factor = _inducing.InducingFactor(kernel, X[:40])
    assert factor.bound.nogil == compiled
    original = type(factor.bound).cross

    def cross(self, Xb, out=None):
        sizes.append(len(Xb))
        return original(self, Xb, out)
    monkeypatch.setattr(type(factor.bound), "cross", cross)
    with _parallel.block_threads(2):
        K2 = factor.cross(X)
    chunks = (_parallel.row_blocks(len(X), factor.bound.row_work) if compiled
              else _inducing.kernel_chunks(len(X)))
    assert factor.chunks(len(X)) == chunks and len(chunks) > 1
    assert sorted(sizes) == sorted(b - a for a, b in chunks)
    np.testing.assert_array_equal(K2, np.concatenate([original(factor.bound, X[a:b])
                                                      for a, b in chunks]))
    # the chunks are the kernel's block to rounding
    np.testing.assert_allclose(K2, kernel(X, factor.Z), rtol=1e-12, atol=0)
