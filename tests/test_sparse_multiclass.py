"""SparseMultiClassGPC and its engine (python/gpc/multiclass/sparse.py, src/gpc_core/_sparse_multiclass.pyx;
docs/derivations-sparse-multiclass.md).

* Z = X: the sparse model is RMGPC itself (derivation §1), so the estimator must reproduce
  MultiClassGPC(model="robust") with the same outlier treatment.
* the gradient (θ of every class, Z, ε) against central differences of the converged evidence, and
  the tied-site gradient against central differences at held tied sites;
* the schedules: a minibatch of all rows is the batch step, minibatch EP reaches batch EP's fixed
  point, q stays the sum of its sites along their kept directions, the engine's shards reproduce
  the in-process fit, and n_jobs changes no bit.
"""

import copy
import functools
import threading
import warnings

import numpy as np
import pytest

from helpers import local_client

from gpc import MultiClassGPC, SparseMultiClassGPC, _parallel, _threads
from gpc.datasets import load_glass, load_thyroid
from gpc.distributed import InProcessEngine
from gpc.kernels import RBF, ConstantKernel
from gpc.multiclass import sparse as S
from gpc.sparse.core import steps, trainers


def _subset(loader, per_class, n_test=10, seed=0):
    """Up to ``per_class`` rows of every class (standardised by the whole set) and ``n_test`` others."""
    data = loader(binary=False)
    index = np.unique(data.y, return_inverse=True)[1]
    X = (data.X - data.X.mean(axis=0)) / data.X.std(axis=0)
    rng = np.random.default_rng(seed)
    idx = np.concatenate([rng.choice(np.flatnonzero(index == c), min(per_class, np.sum(index == c)),
                                     replace=False) for c in range(index.max() + 1)])
    rest = rng.choice(np.setdiff1d(np.arange(len(index)), idx), n_test, replace=False)
    return X[idx], data.y[idx], X[rest]


def _thyroid(n=150, seed=0):
    data = load_thyroid(binary=False)
    X = (data.X - data.X.mean(axis=0)) / data.X.std(axis=0)
    p = np.random.default_rng(seed).permutation(len(data.y))
    return X[p[:n]], data.y[p[:n]], X[p[n:]], data.y[p[n:]]


def _tiny(noise, tied=False, n=24, C=3, D=2, m=5, seed=1, eps=0.05, jitter=1e-8):
    """A small problem with s > 0 everywhere (inducing inputs apart from the data), one kernel with
    its own amplitude and length-scales per class, and every parameter learnt."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    y = np.arange(n) % C
    y[0] = 1
    Zs = [rng.normal(size=(m, D)) * 1.3 for _ in range(C)]
    kernels = [ConstantKernel(1.0 + 0.2 * k) * RBF(np.linspace(0.8, 1.2, D) + 0.3 * k)
               for k in range(C)]
    model = S.ArgmaxLikelihood(C, noise)
    fixed = noise == "fixed"
    state = S.SparseMultiClassState(kernels, Zs, None if tied else y, n, model, jitter, True, 1.0,
                                    tied=tied, label_noise=eps if fixed else None,
                                    noise_bounds=(1e-6, 0.4) if fixed else None)
    return X, y, state, model


# -- Z = X: the exact engine ------------------------------------------------------------------------

#: glass: 6 classes, 9 rows each (54); new-thyroid: 3 classes, 16 each (48)
DATASETS = {"glass": (load_glass, 9), "thyroid": (load_thyroid, 16)}


@pytest.mark.parametrize("label_noise", ["beta", 0.05])
@pytest.mark.parametrize("name", sorted(DATASETS))
def test_z_equals_x_is_exact_rmgpc(name, label_noise):
    """With Z = X, no jitter and fixed hyperparameters, K_uu = K, a_i = Lᵀeᵢ and s = 0: the sites
    and q are the exact engine's number for number (derivation §1-§2), so the latent moments,
    log Z, the outlier probabilities and the predictive probabilities are MultiClassGPC's.
    1e-6 holds with room: both engines are run to a moment mismatch below 1e-10 (the exact one by
    its tol, the sparse one by 600 damped passes, ~1e-13 here), the whitening K L⁻ᵀ costs
    cond(K) × eps ≈ 1e-10 here, and both predict with the same 64-node Gauss–Hermite rule on the
    same moments (measured agreement 2e-9 or better)."""
    loader, per = DATASETS[name]
    X, y, Xs = _subset(loader, per)
    exact = MultiClassGPC(kernel=RBF(1.7), optimizer=None, tol=1e-10, max_iter=5000,
                          label_noise=label_noise, label_noise_bounds="fixed").fit(X, y)
    sparse = SparseMultiClassGPC(kernel=RBF(1.7, "fixed"), n_inducing=len(y), inducing_points=X,
                                 optimize_inducing=False, jitter=0.0, label_noise=label_noise,
                                 label_noise_bounds="fixed", batch_size=None, max_iter=600,
                                 progress=False).fit(X, y)
    means, varis = sparse.predict_latent(X)
    res = exact.ep_result_
    np.testing.assert_allclose(means, np.column_stack([c.mean for c in res.classes]), atol=1e-6,
                               rtol=0)
    np.testing.assert_allclose(varis, np.column_stack([c.diag_cov() for c in res.classes]),
                               atol=1e-6, rtol=0)
    assert abs(sparse.log_marginal_likelihood_value_ - exact.log_marginal_likelihood_value_) < 1e-6
    np.testing.assert_allclose(sparse.outlier_probability_, exact.outlier_probability_, atol=1e-6,
                               rtol=0)
    np.testing.assert_allclose(sparse.predict_proba(Xs), exact.predict_proba(Xs), atol=1e-6, rtol=0)
    assert sparse.outlier_rate_ == pytest.approx(res.rho_mean, rel=1e-6)
    # the test can fail: the outliers are not a formality here
    assert np.max(exact.outlier_probability_) > 0.05


def test_z_equals_x_without_outliers_is_smgpc():
    """model="standard" at Z = X is the exact engine with robust=False (no z, no latent noise)."""
    from gpc.multiclass.ep import rmgpc_ep
    X, y, _ = _subset(load_thyroid, 10)
    kern = RBF(1.7)
    index = np.unique(y, return_inverse=True)[1]
    exact = rmgpc_ep([kern(X)] * 3, index, 3, robust=False, tol=1e-11, max_iter=5000)
    model = S.ArgmaxLikelihood(3, "none")
    state = S.SparseMultiClassState([kern], [X], index, len(y), model, 0.0, False, 1.0)
    rows = S.MultiClassRows(X, index)
    passes, converged = steps.run_ep(state, rows.all_rows(0, state, model), tol=1e-11, max_iter=5000)
    assert converged
    means, _ = S.latent_moments(state, X)
    np.testing.assert_allclose(means, np.column_stack([c.mean for c in exact.classes]), atol=1e-8)
    parts = rows.all_rows(0, state, model).evidence_parts(False, "sites")
    assert state.log_normaliser() + parts.log_terms == pytest.approx(exact.log_evidence, abs=1e-8)


# -- gradients -----------------------------------------------------------------------------------------

def _converge(state, model, X, y, sites=None):
    rows = S.MultiClassRows(X, y)
    if sites is not None:                       # a warm start from a neighbouring fixed point
        state.sites = sites.copy()
        if model.noise == "fixed":
            state.sites.lam_i[:] = state.prior_log_odds
    _, converged = steps.run_ep(state, rows.all_rows(0, state, model), tol=1e-12, max_iter=20000)
    assert converged
    return rows.all_rows(0, state, model)


@pytest.mark.parametrize("held", ["sites", "cavity"])
@pytest.mark.parametrize("noise", ["fixed", "beta", "none"])
def test_gradient_matches_central_differences(noise, held):
    """The analytic gradient of the converged evidence in every parameter (each class's log θ,
    each class's Z, log ε), in both of its forms (derivation §6), against central differences of
    the evidence re-converged at θ ± h d along random directions d and along each block of
    parameters.  h = 1e-5 on O(1) derivatives: truncation ~1e-10, EP's fixed point to 1e-12, so
    the relative agreement asked, 1e-5, is far above the error of either side."""
    X, y, state, model = _tiny(noise)
    rows = _converge(state, model, X, y)
    grad = S.evidence_and_gradient(state, rows.evidence_parts(True, held), 1.0, held)
    p0 = state._params()
    rng = np.random.default_rng(2)
    sizes = [len(k.theta) for k in state.kernels] + [Z.size for Z in state.Zs]
    edges = np.cumsum([0] + sizes + ([1] if noise == "fixed" else []))
    directions = [rng.normal(size=p0.size)]
    for a, b in zip(edges[:-1], edges[1:]):      # each class's θ, each class's Z, ε
        d = np.zeros(p0.size)
        d[a:b] = rng.normal(size=b - a)
        directions.append(d)
    for d in directions:
        values = []
        for sign in (1.0, -1.0):
            moved = _tiny(noise)[2]
            moved._set_params(p0 + sign * 1e-5 * d)
            r = _converge(moved, model, X, y, state.sites)
            values.append(moved.log_normaliser() + r.evidence_parts(False, held).log_terms)
        fd = (values[0] - values[1]) / 2e-5
        assert grad @ d == pytest.approx(fd, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("noise", ["fixed", "none"])
def test_tied_gradient_matches_central_differences_at_held_tied_sites(noise):
    """With the tied sites (T_k, g_k) held in u-space (moved to each new factor by
    transform_natural) the tied evidence's gradient has three parts, the average term among them
    (derivation §7); against central differences of the tied evidence."""
    X, y, state, model = _tiny(noise, tied=True)
    state.optimizer.lr = 0.0                           # hold θ, Z, ε: the tied sites settle
    rows = S.MultiClassRows(X, y)
    for _ in range(20):
        steps.tied_iteration(state, rows.batch_rows(0, state, model, (0, len(y)), False), 0.5)

    def tied(st, gradient):
        return rows.batch_rows(0, st, model, (0, len(y)), False).tied_parts(
            S.tied_cavities(st), gradient)

    grad = S.evidence_and_gradient(state, tied(state, True), 1.0, "cavity")
    p0 = state._params()
    rng = np.random.default_rng(3)
    for _ in range(3):
        d = rng.normal(size=p0.size)
        values = []
        for sign in (1.0, -1.0):
            moved = copy.deepcopy(state)
            moved._set_params(p0 + sign * 1e-5 * d)
            values.append(sum(q.log_normaliser_ratio() for q in moved.qs)
                          + tied(moved, False).log_terms)
        assert grad @ d == pytest.approx((values[0] - values[1]) / 2e-5, rel=1e-5, abs=1e-7)


def test_tied_sites_with_one_row_are_untied_ep():
    """n = 1: the cavity of the only point is the prior and its local EP is EP itself, so the tied
    evidence, q and the outlier probability are untied EP's (derivation §7)."""
    X, y, tied, model = _tiny("fixed", tied=True, n=1)
    _, _, untied, _ = _tiny("fixed", n=1)
    rows = S.MultiClassRows(X, y)
    untied_rows = _converge(untied, model, X, y)
    for _ in range(3):              # damping 1: the average site is the point's local EP
        tied.optimizer.lr = 0.0
        steps.tied_iteration(tied, rows.batch_rows(0, tied, model, (0, 1), False), 1.0)
    for qt, qu in zip(tied.qs, untied.qs):
        np.testing.assert_allclose(qt.P, qu.P, atol=1e-9)
        np.testing.assert_allclose(qt.h, qu.h, atol=1e-9)
    evidence = untied.log_normaliser() + untied_rows.evidence_parts(False, "sites").log_terms
    assert tied.log_z == pytest.approx(evidence, abs=1e-9)
    np.testing.assert_allclose(S.row_outlier_probability(tied, X, y),
                               untied.outlier_probability(), atol=1e-9)


def test_a_dropped_site_update_halves_the_damping():
    """Undamped tied updates on a 60-row problem leave some q_k without a factor at the first step;
    that update is dropped and δ halved (``damping_scale``), after which the tied sites settle
    (before, every later step repeated the same dropped update)."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 2))
    y = (X[:, 0] > 0.4).astype(int) + (X[:, 1] > 0.3).astype(int)
    model = S.ArgmaxLikelihood(3, "fixed")
    state = S.SparseMultiClassState([RBF(2.0)], [rng.normal(size=(6, 2)) * 1.3], None, 60, model,
                                    1e-8, False, 0.0, tied=True, label_noise=0.05)
    rows = S.MultiClassRows(X, y)
    changes = []
    for _ in range(40):
        before = state.qs[0].P.copy()
        steps.tied_iteration(state, rows.batch_rows(0, state, model, (0, 60), False), 1.0)
        changes.append(np.max(np.abs(state.qs[0].P - before)) / np.max(np.abs(before)))
    assert 1 <= state.skipped_passes <= 3 and state.damping_scale < 1.0
    assert changes[-1] < 1e-4


# -- the schedules -----------------------------------------------------------------------------------

def test_minibatch_of_all_rows_takes_the_batch_steps():
    """A minibatch of all n rows is a batch step (gpc.sparse._train.iteration's contract): the
    same sites, q, θ, Z, ε and log Z after each of five steps with Adadelta moving them."""
    X, y, a, model = _tiny("fixed")
    b = _tiny("fixed")[2]
    rows = S.MultiClassRows(X, y)
    for _ in range(5):
        va = steps.iteration(a, rows.all_rows(0, a, model), 0.5)
        vb = steps.iteration(b, rows.batch_rows(0, b, model, (0, len(y))), 0.5)
        assert va == vb
        np.testing.assert_array_equal(a._params(), b._params())
        np.testing.assert_array_equal(a.sites.vector(), b.sites.vector())
        for qa, qb in zip(a.qs, b.qs):
            np.testing.assert_array_equal(qa.P, qb.P)
    assert not np.array_equal(a._params(), _tiny("fixed")[2]._params())    # the steps moved them
    # and the estimator trains in batch when a minibatch would hold every row
    X, y, _, _ = _thyroid(60)
    kw = dict(n_inducing=5, max_iter=2, random_state=0, progress=False)
    assert (SparseMultiClassGPC(batch_size=60, **kw).fit(X, y).log_marginal_likelihood_value_
            == SparseMultiClassGPC(batch_size=None, **kw).fit(X, y).log_marginal_likelihood_value_)


def test_minibatch_ep_reaches_the_batch_fixed_point():
    """At fixed θ, Z and ε, minibatch EP (each block's sites swapped in q along their kept
    directions, SEP eq. (6)) and batch EP share their fixed point.  The directions are kept in
    float32, so q is the sum of its sites to ~1e-7: the fixed points agree to 1e-5."""
    X, y, batch, model = _tiny("beta", n=30)
    mini = _tiny("beta", n=30)[2]
    for st in (batch, mini):
        st.optimizer.lr = 0.0
    rows = S.MultiClassRows(X, y)
    _converge(batch, model, X, y)
    trainer = trainers.SEPMinibatch([mini], model, np.random.default_rng(0), 7, 0.7)
    trainer.train(rows, 150, lambda: None, lambda v: None)
    np.testing.assert_allclose(S.latent_moments(mini, X)[0], S.latent_moments(batch, X)[0],
                               atol=1e-5)
    np.testing.assert_allclose(mini.outlier_probability(), batch.outlier_probability(), atol=1e-5)
    assert mini.beta_posterior() == pytest.approx(batch.beta_posterior(), rel=1e-5)


def test_minibatch_q_is_the_sum_of_its_sites_along_their_directions():
    """After minibatch steps that move θ and Z, each q_k is I + Σ_r Λ_r a'_r a'_rᵀ, h_k = Σ_r v_r a'_r
    over its rows' sites along their kept directions a'_r = L_kᵀ v_r (float32: 1e-6 relative)."""
    X, y, state, model = _tiny("fixed", n=30)
    trainer = trainers.SEPMinibatch([state], model, np.random.default_rng(0), 8, 1.0)
    trainer.train(S.MultiClassRows(X, y), 4, lambda: None, lambda v: None)
    assert not np.array_equal(state._params(), _tiny("fixed", n=30)[2]._params())
    tau, eta = state.sites.class_sites()
    for k, (q, f) in enumerate(zip(state.qs, state.factors)):
        A_old = state.V[k].astype(np.float64) @ f.L          # rows a'_r = L_kᵀ v_r
        P = np.eye(f.m) + A_old.T @ (tau[:, k, None] * A_old)
        np.testing.assert_allclose(q.P, P, atol=1e-6 * np.max(np.abs(P)))
        np.testing.assert_allclose(q.h, A_old.T @ eta[:, k], atol=1e-6 * np.max(np.abs(q.h)))


def _small_blocks(monkeypatch):
    """Blocks small enough that thyroid's rows make several per class: 120 rows x 8² make one
    block of gpc._parallel's default BLOCK_WORK, 15 of 2⁹ (a minibatch of 40: 5), and ranges of
    16 points make 8 (3) ranges of the compiled passes."""
    monkeypatch.setattr(_parallel, "BLOCK_WORK", 2 ** 9)
    monkeypatch.setattr(_threads, "BLOCK_THREADS_FROM", 2 * 2 ** 9)    # the policy's two blocks
    # a fresh cache of the fixed blocks for this test: the module's cache holds blocks cut by the
    # default BLOCK_WORK (whichever earlier test asked for the same rows), and must not keep these
    monkeypatch.setattr(_parallel, "row_blocks",
                        functools.lru_cache(maxsize=512)(_parallel.row_blocks.__wrapped__))
    monkeypatch.setattr(S, "RANGE_ROWS", 16)


@pytest.mark.parametrize("kw", [dict(), dict(batch_size=40), dict(tied_sites=True, batch_size=40),
                                dict(batch_size=40, label_noise="beta", shared_kernel=False)])
def test_results_do_not_depend_on_n_jobs(kw, monkeypatch):
    """n_jobs threads run the class blocks × row blocks and the ranges of points; BLAS is pinned
    to one thread and every sum is taken in a fixed order: the fit and its predictions are the
    same bits (not merely equal to rounding) for 1, 2 and 3 threads."""
    _small_blocks(monkeypatch)
    X, y, Xt, _ = _thyroid(120)
    kw = dict(dict(label_noise=0.02), **kw)
    fits = [SparseMultiClassGPC(n_inducing=8, max_iter=3, random_state=0, progress=False,
                                n_jobs=j, **kw).fit(X, y) for j in (1, 2, 3)]
    base = fits[0].predict_proba(Xt)
    for clf in fits[1:]:
        assert clf.log_marginal_likelihood_value_ == fits[0].log_marginal_likelihood_value_
        np.testing.assert_array_equal(clf.predict_proba(Xt), base)
        for Za, Zb in zip(clf.inducing_points_, fits[0].inducing_points_):
            np.testing.assert_array_equal(Za, Zb)
    # a model fitted on one thread predicts the same bits on two
    np.testing.assert_array_equal(fits[0].set_params(n_jobs=2).predict_proba(Xt), base)


def test_class_and_row_blocks_run_on_the_threads_with_blas_pinned(monkeypatch):
    """With n_jobs=2 a minibatch step's marginals and sums go out as every class's row blocks at
    once (more tasks than classes), a thread of the pool takes some of them, and BLAS runs on
    one thread inside every task; after the fit BLAS has its threads back."""
    _small_blocks(monkeypatch)
    from gpc import _threads
    what = _threads.controller()

    def blas_threads():
        return max(lib.num_threads for lib in what.lib_controllers if lib.user_api == "blas")

    calls, original = [], _parallel.over_blocks
    caller = threading.get_ident()

    def spy(fn, n_blocks):
        ran, blas = set(), []
        shared = _parallel.threads_now() == 2 and n_blocks > 1
        pool_took_one = threading.Event()

        def task(j):
            ran.add(threading.get_ident())
            blas.append(blas_threads())
            # on a busy machine the caller could run a whole pass before the pool wakes: its
            # tasks of a shared pass wait (at most 10 s) until the pool has taken one of the pass
            if threading.get_ident() != caller:
                pool_took_one.set()
            elif shared:
                pool_took_one.wait(10.0)
            return fn(j)
        out = original(task, n_blocks)
        calls.append((n_blocks, _parallel.threads_now(), ran, blas))
        return out

    monkeypatch.setattr(_parallel, "over_blocks", spy)
    before = blas_threads()
    X, y, _, _ = _thyroid(120)
    SparseMultiClassGPC(n_inducing=8, max_iter=1, batch_size=40, label_noise=0.02,
                        shared_kernel=False, random_state=0, progress=False, n_jobs=2).fit(X, y)
    C, row_blocks = len(np.unique(y)), len(_parallel.row_blocks(40, 8 * 8))
    shared = [c for c in calls if c[0] == C * row_blocks and c[1] == 2]
    assert row_blocks > 1 and shared, "no pass of every class's row blocks ran on 2 threads"
    assert any(ran - {threading.get_ident()} for _, _, ran, _ in shared)
    assert all(b == 1 for _, _, _, blas in calls for b in blas)
    assert blas_threads() == before


@pytest.mark.parametrize("label_noise", [0.02, "beta"])
def test_client_engine_reproduces_the_in_process_batch_fit(label_noise):
    """client=InProcessEngine(n_shards=K): the shards run the in-process passes and their sums are
    added in shard order.  Fixed ε: the fit equals the in-process one to rounding for any K.  Beta:
    one shard is the in-process schedule; with three the shards refine their ψ̃ᵢ in parallel, a
    different schedule with the same fixed point (checked at fixed hyperparameters)."""
    X, y, Xt, _ = _thyroid(90)
    kw = dict(n_inducing=8, max_iter=5, label_noise=label_noise, random_state=0, progress=False)
    local = SparseMultiClassGPC(**kw).fit(X, y)
    for shards in ((1, 3) if label_noise != "beta" else (1,)):
        remote = SparseMultiClassGPC(client=InProcessEngine(n_shards=shards), **kw).fit(X, y)
        # sums of three shards in another order: rounding, amplified by five Adadelta steps
        assert remote.log_marginal_likelihood_value_ == pytest.approx(
            local.log_marginal_likelihood_value_, rel=1e-10)
        np.testing.assert_allclose(remote.predict_proba(Xt), local.predict_proba(Xt), atol=1e-10)
        np.testing.assert_allclose(remote.outlier_probability_, local.outlier_probability_,
                                   atol=1e-10)
    if label_noise == "beta":
        fixed = dict(kw, kernel=ConstantKernel(1.0, "fixed") * RBF(1.5, "fixed"),
                     optimize_inducing=False, max_iter=500)
        local = SparseMultiClassGPC(**fixed).fit(X, y)
        remote = SparseMultiClassGPC(client=InProcessEngine(n_shards=3), **fixed).fit(X, y)
        # both at a moment mismatch below 1e-8, so their moments agree to ~1e-7
        assert local._state.mismatch < 1e-8 and remote._state.mismatch < 1e-8
        np.testing.assert_allclose(remote.predict_proba(Xt), local.predict_proba(Xt), atol=1e-6)
        np.testing.assert_allclose(remote.outlier_probability_, local.outlier_probability_,
                                   atol=1e-6)
    with pytest.raises(ValueError, match="batch"):
        SparseMultiClassGPC(client=InProcessEngine(2), batch_size=30, **kw).fit(X, y)


def test_client_on_a_dask_cluster_equals_in_process():
    """The shard steps pickle and run on a LocalCluster (2 worker processes, loopback): a batch fit
    with every parameter learnt equals the in-process one to rounding, the sites come home, and
    the pickled model continues in process.  Every wait is bounded (300 s: a loaded machine)."""
    import pickle

    pytest.importorskip("distributed")
    X, y, Xt, _ = _thyroid(90)
    kw = dict(n_inducing=8, max_iter=4, label_noise=0.02, random_state=0, progress=False)
    local = SparseMultiClassGPC(**kw).fit(X, y)
    with local_client() as client:
        remote = SparseMultiClassGPC(client=client, **kw).fit(X, y)
    assert remote.log_marginal_likelihood_value_ == pytest.approx(
        local.log_marginal_likelihood_value_, rel=1e-10)
    np.testing.assert_allclose(remote.outlier_probability_, local.outlier_probability_, atol=1e-10)
    remote = pickle.loads(pickle.dumps(remote))
    assert remote.client is None
    remote.partial_fit(X, y)
    local.partial_fit(X, y)
    np.testing.assert_allclose(remote.predict_proba(Xt), local.predict_proba(Xt), atol=1e-9)


# -- the estimator -----------------------------------------------------------------------------------

def test_fit_learns_and_flags_flipped_labels():
    """Training raises the evidence, classifies new-thyroid well, and the flipped labels are the
    most probable outliers (RMGPC §5's experiment in small)."""
    X, y, Xt, yt = _thyroid(150)
    y = y.copy()
    rng = np.random.default_rng(0)
    flipped = rng.choice(len(y), size=6, replace=False)
    classes = np.unique(y)
    for i in flipped:
        y[i] = rng.choice(np.setdiff1d(classes, [y[i]]))
    clf = SparseMultiClassGPC(n_inducing=10, max_iter=30, random_state=0, progress=False,
                              validation_data=(Xt, yt)).fit(X, y)
    h = clf.history_
    assert h[-1]["objective"] > h[0]["objective"] + 10.0
    assert [e["iteration"] for e in h] == list(range(1, 31))
    # new-thyroid: GP classifiers reach ~0.95; 0.9 is far above the 0.7 majority rate
    assert clf.score(Xt, yt) > 0.9 and h[-1]["val_error"] < 0.1
    top = np.argsort(clf.outlier_probability_)[::-1][:len(flipped)]
    assert len(np.intersect1d(top, flipped)) >= len(flipped) - 1
    np.testing.assert_allclose(clf.predict_proba(Xt).sum(axis=1), 1.0, atol=1e-12)
    rows = clf.outlier_probability(X[flipped], y[flipped])
    assert np.all(rows > np.median(clf.outlier_probability_))


@pytest.mark.parametrize("kw", [dict(shared_kernel=True, shared_inducing=True),
                                dict(shared_inducing=True, model="standard"),
                                dict(kernel=[RBF(1.0), RBF(2.0), ConstantKernel(2.0) * RBF(1.0)])])
def test_shared_and_per_class_parameters(kw):
    X, y, Xt, yt = _thyroid(120)
    clf = SparseMultiClassGPC(n_inducing=8, max_iter=10, random_state=0, progress=False,
                              **kw).fit(X, y)
    assert clf.score(Xt, yt) > 0.85
    Zs = clf.inducing_points_
    if kw.get("shared_inducing"):
        assert Zs.shape == (8, X.shape[1])
    else:
        assert len(Zs) == 3 and not np.array_equal(Zs[0], Zs[1])     # each class moved its own
    kernels = clf.kernels_
    assert len(kernels) == 3
    if kw.get("shared_kernel"):
        assert kernels[0] == kernels[1] == kernels[2]
    if kw.get("model") == "standard":
        assert np.all(clf.outlier_probability_ == 0.0) and clf.outlier_rate_ == 0.0


@pytest.mark.parametrize("method", ["ep", "vi"])
def test_each_class_can_start_at_its_own_inducing_points(method):
    """inducing_points (C, m, d): class k's factor starts at the k-th array (seen with Z fixed),
    and a wrong count, shape or a shared Z is refused."""
    X, y, _, _ = _thyroid(120)
    starts = np.stack([X[k * 8:(k + 1) * 8] for k in range(3)])
    kw = dict(n_inducing=8, max_iter=2, optimize_inducing=False, random_state=0, progress=False,
              method=method, **({"label_noise": 0.02} if method == "vi" else {}))
    clf = SparseMultiClassGPC(inducing_points=starts, **kw).fit(X, y)
    for Z, start in zip(clf.inducing_points_, starts):
        np.testing.assert_array_equal(Z, start)
    assert not np.array_equal(starts[0], starts[1])
    if method == "ep":      # the shards get each class's own Z too (sums in shard order: rounding)
        fixed = dict(kw, inducing_points=starts, label_noise=0.02)
        local = SparseMultiClassGPC(**fixed).fit(X, y)
        remote = SparseMultiClassGPC(client=InProcessEngine(n_shards=2), **fixed).fit(X, y)
        assert remote.log_marginal_likelihood_value_ == pytest.approx(
            local.log_marginal_likelihood_value_, rel=1e-10)
    for bad in (starts[:2], starts[:, :, :2], np.where(starts == starts[0, 0, 0], np.nan, starts),
                [starts[0], starts[1][:4], starts[2]], "grid"):
        with pytest.raises(ValueError, match="inducing_points must be"):
            SparseMultiClassGPC(inducing_points=bad, **kw).fit(X, y)
    with pytest.raises(ValueError, match="shared_inducing"):
        SparseMultiClassGPC(inducing_points=starts, shared_inducing=True, **kw).fit(X, y)


def test_partial_fit_continues_and_tied_sites_take_a_stream():
    X, y, Xt, yt = _thyroid(120)
    kw = dict(n_inducing=8, label_noise=0.02, random_state=0, progress=False)
    whole = SparseMultiClassGPC(max_iter=3, **kw).fit(X, y)
    parts = SparseMultiClassGPC(**kw)
    for _ in range(3):
        parts.partial_fit(X, y)
    # batch steps have no randomness: three partial fits are the three epochs of fit
    assert parts.log_marginal_likelihood_value_ == whole.log_marginal_likelihood_value_
    assert parts.n_iter_ == 3
    with pytest.raises(ValueError, match="rows"):
        parts.partial_fit(X[:50], y[:50])
    changed = y.copy()
    changed[0] = [c for c in np.unique(y) if c != y[0]][0]
    with pytest.raises(ValueError, match="labels"):
        parts.partial_fit(X, changed)
    with pytest.raises(ValueError, match="not in classes_"):
        parts.partial_fit(X, np.where(y == y[0], "nope", y))
    stream = SparseMultiClassGPC(tied_sites=True, batch_size=20, **kw)
    for start in range(0, 120, 40):               # rows never seen before, 40 at a time
        stream.partial_fit(X[start:start + 40], y[start:start + 40], classes=np.unique(y))
    assert stream.n_iter_ == 3 and stream._state.sites is None
    assert stream.score(Xt, yt) > 0.85
    p = stream.outlier_probability(X, y)
    assert p.shape == (120,) and np.all((p > 0) & (p < 1))
    with pytest.raises(AttributeError, match="outlier_probability"):
        stream.outlier_probability_


@pytest.mark.parametrize("params, match", [
    (dict(tied_sites=True), "tied_sites"), (dict(label_noise=0.9), "label_noise"),
    (dict(label_noise="gaussian"), "label_noise"), (dict(model="heavy-tailed"), "model"),
    (dict(model="standard", label_noise=0.1), "model"),
    (dict(damping=1.5), "damping"), (dict(label_noise_bounds=(0.1, 2.0)), "label_noise_bounds"),
    (dict(kernel=[RBF(1.0)] * 2), "kernel"), (dict(kernel=[RBF(1.0)] * 3, shared_kernel=True),
                                              "shared_kernel"),
    (dict(n_jobs=0), "n_jobs"), (dict(tied_sites=True, label_noise=0.1,
                                      client=InProcessEngine(1)), "client"),
])
def test_bad_parameters(params, match):
    X, y, _, _ = _thyroid(60)
    params = {"n_inducing": 5, **params}
    with pytest.raises(ValueError, match=match):
        SparseMultiClassGPC(max_iter=1, progress=False, **params).fit(X, y)


def test_bad_input():
    X, y, _, _ = _thyroid(60)
    clf = SparseMultiClassGPC(n_inducing=5, max_iter=1, progress=False)
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        clf.fit(bad, y)
    with pytest.raises(ValueError, match="one class"):
        clf.fit(X, np.zeros(len(y)))
    with pytest.raises(ValueError, match="samples"):
        clf.fit(X, y[:-1])
    clf.fit(X, y)
    with pytest.raises(ValueError, match="features"):
        clf.predict(X[:, :3])
    with pytest.raises(ValueError, match="not in classes_"):
        clf.outlier_probability(X[:3], ["nope"] * 3)
    with pytest.raises(ValueError, match="NaN"):
        clf.predict_proba(bad)


def test_compiled_passes_check_their_inputs():
    from gpc._sparse_multiclass import refine_block
    z = np.zeros((4, 3))
    y = np.array([0, 1, 2, 0], dtype=np.intp)
    others = np.array([[1, 2], [0, 2], [0, 1], [1, 2]], dtype=np.intp)
    args = [z.copy() for _ in range(5)]
    with pytest.raises(ValueError, match="rows 0:9"):
        refine_block(y, others, *args, np.zeros(4), np.ones((4, 3)), np.ones((4, 3)), z, z + 1,
                     0.5, True, -0.5, 0, 9)
    with pytest.raises(ValueError, match="label 5"):
        refine_block(np.array([0, 5, 2, 0], dtype=np.intp), others, *args, np.zeros(4),
                     np.ones((4, 3)), np.ones((4, 3)), z, z + 1, 0.5, True, -0.5, 0, 4)
    with pytest.raises(ValueError, match="must be"):
        refine_block(y, others, *args, np.zeros(4), np.ones((4, 2)), np.ones((4, 3)), z, z + 1,
                     0.5, True, -0.5, 0, 4)


def test_sklearn_conventions():
    pytest.importorskip("sklearn")
    from sklearn.base import clone
    from sklearn.utils.estimator_checks import check_estimator
    clf = SparseMultiClassGPC(n_inducing=5, max_iter=2, random_state=0, progress=False)
    assert clone(clf).get_params() == clf.get_params()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_estimator(clf)


def test_docstring_example_runs():
    import doctest

    import gpc.multiclass.sparse_estimator as module
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("batch_size, damping, expected", [
    (30, None, 0.5), (None, None, 0.5), (30, 1.0, 1.0)])
def test_site_damping_defaults_to_half_in_every_schedule(batch_size, damping, expected):
    """RMGPC §3's damping 0.5 is the default for batch and for minibatches with per-row sites
    (undamped minibatch updates oscillated on ten classes); a damping passed in is kept."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(60, 2))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.3).astype(int)
    clf = SparseMultiClassGPC(n_inducing=5, label_noise=0.05, batch_size=batch_size, max_iter=1,
                              damping=damping, progress=False, random_state=0).fit(X, y)
    assert clf._trainer.damping == expected
