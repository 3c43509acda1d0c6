"""SparseMultiClassGPC(method="vi"): the variational baseline (python/gpc/multiclass/sparse_vi.py;
docs/derivations-sparse-multiclass.md §11).

* the Gauss–Hermite P(y is the argmax) and its derivatives against Monte Carlo and central
  differences; the bound's data terms against Monte Carlo of the model's latent values under q;
* the bound's gradient in every class's θ, Z, q(w_k) and log ε against central differences, and
  the minibatch estimates' n/|M| scaling;
* the estimator: a fit on new-thyroid comparable to EP's, n_jobs, partial_fit, a callable
  optimizer, bad parameters, scikit-learn's conventions;
* tied-site EP keeps no array of the training rows' length (the memory bench's claim, as structure).
"""

import warnings

import numpy as np
import pytest
from scipy.optimize import minimize

from gpc import SparseMultiClassGPC
from gpc.datasets import load_thyroid
from gpc.kernels import RBF, ConstantKernel
from gpc.multiclass.sparse import RowBlock
from gpc.multiclass.sparse_vi import SparseMultiClassVIState, argmax_probability
from helpers import central_differences


def _thyroid(n=150, seed=0):
    data = load_thyroid(binary=False)
    X = (data.X - data.X.mean(axis=0)) / data.X.std(axis=0)
    p = np.random.default_rng(seed).permutation(len(data.y))
    return X[p[:n]], data.y[p[:n]], X[p[n:]], data.y[p[n:]]


def _tiny(n=24, C=3, D=2, m=5, seed=1, eps=0.05, shared=False, learn_eps=True):
    """A small problem, every class with its own amplitude and length-scales (or one shared kernel
    and Z), every parameter learnt, and q away from the prior (random means, random L_q)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    y = np.arange(n) % C
    y[0] = 1
    groups = 1 if shared else C
    Zs = [rng.normal(size=(m, D)) * 1.3 for _ in range(groups)]
    kernels = [ConstantKernel(1.0 + 0.2 * k) * RBF(np.linspace(0.8, 1.2, D) + 0.3 * k)
               for k in range(groups)]
    state = SparseMultiClassVIState(kernels, Zs, n, C, eps, (1e-6, 0.4) if learn_eps else None,
                                    1e-8, True)
    p = state.params()
    q_start = len(p) - C * (m + m * (m + 1) // 2)
    for k in range(C):
        at = q_start + k * (m + m * (m + 1) // 2)
        p[at:at + m] = rng.normal(size=m)
        L = np.tril(0.3 * rng.normal(size=(m, m)), -1) + np.diag(rng.uniform(0.3, 0.9, m))
        p[at + m:at + m + m * (m + 1) // 2] = L[np.tril_indices(m)]
    state._set(p)
    return X, y, state


# -- the quadrature -------------------------------------------------------------------------------

def _random_marginals(b=6, C=4, seed=0):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(b, C))
    varis = rng.uniform(0.2, 2.0, size=(b, C))
    y = rng.integers(0, C, size=b)
    return means, varis, y


def test_argmax_probability_matches_monte_carlo():
    means, varis, y = _random_marginals()
    P, _, _ = argmax_probability(means, varis, y)
    rng = np.random.default_rng(1)
    N = 400_000
    f = means[:, None, :] + np.sqrt(varis)[:, None, :] * rng.normal(size=(len(y), N, 4))
    mc = np.mean(np.argmax(f, axis=2) == y[:, None], axis=1)
    se = np.sqrt(mc * (1 - mc) / N)             # ≤ 7.9e-4
    # five standard errors (a false alarm at 6 · 10⁻⁷ per row); the 64-node rule's own error
    # at these variances is far below the Monte Carlo noise
    assert np.all(np.abs(P - mc) < 5 * se + 1e-6)
    assert np.all((P > 0.0) & (P < 1.0))


def test_argmax_probability_sums_to_one_over_the_labels():
    """Σ_y P(y is the argmax) = 1 (up to the rule's error): a check of P independent of MC."""
    means, varis, _ = _random_marginals(b=5, C=5, seed=3)
    total = sum(argmax_probability(means, varis, np.full(5, c))[0] for c in range(5))
    # the 64-node rule on smooth integrands with variances within a factor 10: error < 1e-8
    np.testing.assert_allclose(total, 1.0, atol=1e-8)


def test_argmax_probability_derivatives_match_central_differences():
    means, varis, y = _random_marginals(b=5, C=4, seed=2)
    _, d_mean, d_var = argmax_probability(means, varis, y)
    h = 1e-6

    def moved(which, i, k, step):
        args = [means.copy(), varis.copy()]
        args[which][i, k] += step
        return argmax_probability(*args, y)[0][i]

    for which, analytic in ((0, d_mean), (1, d_var)):
        for i, k in np.ndindex(means.shape):
            fd = (moved(which, i, k, h) - moved(which, i, k, -h)) / (2 * h)
            # central differences: O(h²) truncation and ~1e-16/h rounding, 1e-9 absolute
            assert abs(fd - analytic[i, k]) < 1e-9


def test_derivatives_are_finite_where_a_class_is_far_behind():
    """A class far below y (Φ underflows to 0 in its own factor) keeps finite derivatives."""
    means = np.array([[0.0, -60.0, 0.5]])
    varis = np.array([[1.0, 0.01, 0.5]])
    P, d_mean, d_var = argmax_probability(means, varis, np.array([0]))
    assert np.all(np.isfinite(d_mean)) and np.all(np.isfinite(d_var))
    P2, _, _ = argmax_probability(means[:, [0, 2]], varis[:, [0, 2]], np.array([0]))
    np.testing.assert_allclose(P, P2, rtol=1e-12)        # that class's Φ is 1 at every node
    assert abs(d_mean[0, 1]) < 1e-300


# -- the bound -------------------------------------------------------------------------------------

def test_data_terms_match_monte_carlo_of_the_latent_values():
    """Σᵢ E_q[log p(yᵢ | fᵢ)] of the state (quadrature on its marginals) against sampling w_k from
    q(w_k) and fᵢₖ = a_ikᵀw_k + √s_ik ξ, the model's latent values, and counting argmax hits."""
    X, y, state = _tiny(n=12)
    C = state.C
    e, p_sum, _ = state._block(np.ascontiguousarray(X), y)
    block = RowBlock(np.ascontiguousarray(X), state.factors)
    rng = np.random.default_rng(5)
    N = 200_000
    f = np.empty((N, len(y), C))
    for k in range(C):
        w = state.means[k] + rng.normal(size=(N, len(state.means[k]))) @ state.Lqs[k].T
        f[:, :, k] = w @ block.A[k].T + np.sqrt(block.s[:, k]) * rng.normal(size=(N, len(y)))
    hits = (np.argmax(f, axis=2) == y).mean(axis=0)
    se = np.sqrt(np.sum(hits * (1 - hits)) / N)     # of Σ P (rows independent): ≤ 3.9e-3
    assert abs(p_sum - hits.sum()) < 5 * se
    eps = state.eps
    expected = np.sum(np.log(eps / (C - 1)) + (np.log1p(-eps) - np.log(eps / (C - 1))) * hits)
    assert abs(e - expected) < 5 * se * (np.log1p(-eps) - np.log(eps / (C - 1)))


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_bound_gradient_matches_central_differences(shared, scale):
    X, y, state = _tiny(shared=shared)
    p = state.params()
    value, grad = state.objective(None, X, y, p, 7, scale=scale)    # blocks of 7 rows: 4 blocks
    assert np.isfinite(value) and grad.shape == p.shape
    fd = central_differences(lambda q: state.objective(None, X, y, q, 7, scale=scale)[0], p,
                             h=1e-6)
    # the bound is O(10²): central differences of step 1e-6 carry ~1e-8 rounding; 1e-6 relative
    # to the gradient's scale covers that and the O(h²) truncation
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6 * np.max(np.abs(fd)))
    # every kind of parameter is there and moves the bound
    n_theta = sum(len(k.theta) for k in state.kernels)
    assert n_theta == (1 if shared else 3) * 3 and np.all(grad[:n_theta] != 0.0)
    # the bounds follow the same order: θ's, Z free, log ε within log(1e-6, 0.4), q free
    bounds = state.bounds()
    eps_at = n_theta + sum(Z.size for Z in state.Zs)
    assert bounds.shape == (len(p), 2) and np.all(np.isfinite(bounds[:n_theta]))
    np.testing.assert_allclose(bounds[eps_at], np.log([1e-6, 0.4]))
    assert np.all(np.isinf(np.delete(bounds, list(range(n_theta)) + [eps_at], axis=0)))


def test_minibatch_estimates_average_to_the_bound():
    """The data terms scaled by n/|M| (SEP eq. (6)'s scaling): the mean of the minibatch estimates
    over a partition of the rows is the full bound, and so is the mean of their gradients."""
    X, y, state = _tiny(n=24)
    p = state.params()
    full, g_full = state.objective(None, X, y, p, 24)
    parts = [state.objective(None, X[a:a + 6], y[a:a + 6], p, 6, scale=24 / 6)
             for a in range(0, 24, 6)]
    # sums of 4 terms of size O(10²): rounding ~1e-13
    np.testing.assert_allclose(np.mean([v for v, _ in parts]), full, rtol=1e-12)
    np.testing.assert_allclose(np.mean([g for _, g in parts], axis=0), g_full, rtol=1e-10,
                               atol=1e-12 * np.max(np.abs(g_full)))


def test_bound_is_below_zero_and_q_at_the_prior_has_no_kl():
    X, y, state = _tiny(n=24)
    p = state.params()
    value, _ = state.objective(None, X, y, p, 24)
    # each data term is at most log(1 − ε) < 0 and the KL is ≥ 0
    assert value < len(y) * np.log1p(-state.eps)
    prior = SparseMultiClassVIState(state.kernels, state.Zs, 24, 3, state.eps, None, 1e-8, False)
    e, _, _ = prior._block(np.ascontiguousarray(X), y)
    np.testing.assert_allclose(prior.objective(None, X, y, prior.params(), 24)[0], e, rtol=1e-14)


# -- the estimator ---------------------------------------------------------------------------------

def test_fit_on_thyroid_is_comparable_to_ep():
    X, y, Xt, yt = _thyroid(150)
    kw = dict(n_inducing=10, label_noise=0.02, random_state=0, progress=False)
    vi = SparseMultiClassGPC(method="vi", max_iter=60, validation_data=(Xt, yt), **kw).fit(X, y)
    ep = SparseMultiClassGPC(max_iter=30, **kw).fit(X, y)
    h = vi.history_
    assert len(h) == 60 and h[-1]["objective"] > h[0]["objective"] + 100.0
    err_vi, err_ep = 1.0 - vi.score(Xt, yt), 1.0 - ep.score(Xt, yt)
    # 65 test rows: GP classifiers reach ~5% error here; "comparable" = within 3 rows of EP's
    assert err_vi < 0.1 and abs(err_vi - err_ep) <= 3 / len(yt) + 1e-12
    assert h[-1]["val_error"] == pytest.approx(err_vi)
    P = vi.predict_proba(Xt)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
    rho = vi.outlier_rate_
    assert rho == pytest.approx(3 * vi.label_noise_ / 2)
    # P(y* = c) = ρ/C + (1 − ρ) P(argmax = c) lies in [ρ/C, ρ/C + 1 − ρ]
    assert np.all(P >= rho / 3 - 1e-12) and np.all(P <= rho / 3 + 1 - rho + 1e-12)
    assert vi.log_marginal_likelihood_value_ == h[-1]["objective"]


def test_minibatch_fit_learns_and_flags_flipped_labels():
    X, y, Xt, yt = _thyroid(150)
    y = y.copy()
    rng = np.random.default_rng(0)
    flipped = rng.choice(len(y), size=6, replace=False)
    classes = np.unique(y)
    for i in flipped:
        y[i] = rng.choice(np.setdiff1d(classes, [y[i]]))
    clf = SparseMultiClassGPC(method="vi", n_inducing=10, label_noise=0.05, batch_size=30,
                              max_iter=40, random_state=0, progress=False).fit(X, y)
    assert 1.0 - clf.score(Xt, yt) < 0.1
    p = clf.outlier_probability(X, y)
    assert p.shape == (150,) and np.all((p > 0) & (p <= 1))
    top = np.argsort(p)[::-1][:len(flipped)]
    assert len(np.intersect1d(top, flipped)) >= len(flipped) - 1
    with pytest.raises(AttributeError, match="outlier_probability"):
        clf.outlier_probability_


@pytest.mark.parametrize("kw", [dict(batch_size=None, max_iter=8),
                                dict(batch_size=40, max_iter=2),
                                dict(batch_size=None, max_iter=4, shared_kernel=True,
                                     shared_inducing=True)])
def test_results_do_not_depend_on_n_jobs(kw):
    X, y, Xt, _ = _thyroid(120)
    fits = [SparseMultiClassGPC(method="vi", n_inducing=6, label_noise=0.05, random_state=0,
                                progress=False, n_jobs=j, **kw).fit(X, y) for j in (1, 3)]
    assert fits[0].log_marginal_likelihood_value_ == fits[1].log_marginal_likelihood_value_
    np.testing.assert_array_equal(fits[0].predict_proba(Xt), fits[1].predict_proba(Xt))


def test_partial_fit_continues():
    X, y, _, _ = _thyroid(120)
    kw = dict(method="vi", n_inducing=6, label_noise=0.05, random_state=0, progress=False)
    whole = SparseMultiClassGPC(batch_size=40, max_iter=3, **kw).fit(X, y)
    parts = SparseMultiClassGPC(batch_size=40, **kw)
    for _ in range(3):
        parts.partial_fit(X, y)
    # the minibatch order comes from the same generator: three partial fits are fit's epochs
    assert parts.log_marginal_likelihood_value_ == whole.log_marginal_likelihood_value_
    assert parts.n_iter_ == 3
    with pytest.raises(ValueError, match="rows"):
        parts.partial_fit(X[:50], y[:50])
    batch = SparseMultiClassGPC(batch_size=None, max_iter=5, **kw).fit(X, y)
    before = batch.log_marginal_likelihood_value_
    batch.partial_fit(X, y)               # L-BFGS-B restarted: its start point and one step
    assert batch.n_iter_ == 7 and batch.log_marginal_likelihood_value_ >= before


def _lbfgsb(obj_func, initial_theta, bounds):
    """scikit-learn's optimizer convention, by scipy's L-BFGS-B on its defaults."""
    res = minimize(obj_func, initial_theta, jac=True, method="L-BFGS-B", bounds=bounds)
    return res.x, res.fun


def test_a_callable_optimizer_maximises_the_bound_within_the_budget():
    """optimizer=callable (scikit-learn's convention) in place of L-BFGS-B: the same optimiser
    through it gives the same bits; it is stopped after max_iter evaluations; the fit keeps the
    best point it evaluated, whatever the callable returns."""
    X, y, Xt, _ = _thyroid(120)
    kw = dict(method="vi", n_inducing=6, label_noise=0.05, random_state=0, progress=False,
              batch_size=None, max_iter=12)
    default = SparseMultiClassGPC(**kw).fit(X, y)
    through = SparseMultiClassGPC(optimizer=_lbfgsb, **kw).fit(X, y)
    assert through.log_marginal_likelihood_value_ == default.log_marginal_likelihood_value_
    np.testing.assert_array_equal(through.predict_proba(Xt), default.predict_proba(Xt))
    seen = []

    def worse_last(obj_func, theta, bounds):
        assert bounds.shape == (len(theta), 2) and np.all(bounds[:, 0] <= theta)
        seen.append(-obj_func(theta, eval_gradient=False))
        value, grad = obj_func(theta)
        seen.append(-value)
        seen.append(-obj_func(np.clip(theta + 3.0 * np.sign(grad), *bounds.T))[0])
        while True:                   # stopped by the budget, not by returning
            obj_func(theta)
            seen.append(None)

    fit = SparseMultiClassGPC(optimizer=worse_last, **kw).fit(X, y)
    assert len(seen) == kw["max_iter"] and seen[0] == seen[1] > seen[2]
    assert fit.log_marginal_likelihood_value_ == seen[0]
    start = SparseMultiClassGPC(**{**kw, "max_iter": 1}).fit(X, y)
    assert start.log_marginal_likelihood_value_ == seen[0]


@pytest.mark.parametrize("params, match", [
    (dict(), "label_noise='beta'"), (dict(model="standard"), "model='standard'"),
    (dict(label_noise=0.1, tied_sites=True), "tied_sites"),
    (dict(label_noise=0.1, client=object()), "client"),
    (dict(label_noise=0.9), "label_noise"), (dict(method="svi"), "method"),
    (dict(label_noise=0.1, optimizer="adam"), "optimizer must be"),
    (dict(method="ep", label_noise=0.1, optimizer=_lbfgsb), "step_rule"),
    (dict(label_noise=0.1, optimizer=_lbfgsb, batch_size=20), "batch_size=None"),
])
def test_bad_parameters(params, match):
    X, y, _, _ = _thyroid(60)
    params = {"method": "vi", **params}
    with pytest.raises(ValueError, match=match):
        SparseMultiClassGPC(n_inducing=5, max_iter=1, progress=False, **params).fit(X, y)


def test_bad_input():
    X, y, _, _ = _thyroid(60)
    clf = SparseMultiClassGPC(method="vi", label_noise=0.05, n_inducing=5, max_iter=1,
                              progress=False)
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        clf.fit(bad, y)
    with pytest.raises(ValueError, match="one class"):
        clf.fit(X, np.zeros(len(y)))
    clf.fit(X, y)
    with pytest.raises(ValueError, match="features"):
        clf.predict(X[:, :3])
    with pytest.raises(ValueError, match="not in classes_"):
        clf.outlier_probability(X[:3], ["nope"] * 3)


def test_sklearn_conventions():
    pytest.importorskip("sklearn")
    from sklearn.base import clone
    from sklearn.utils.estimator_checks import check_estimator
    clf = SparseMultiClassGPC(method="vi", label_noise=0.05, n_inducing=5, max_iter=2,
                              random_state=0, progress=False)
    assert clone(clf).get_params() == clf.get_params()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_estimator(clf)


# -- memory: tied sites keep nothing per row -------------------------------------------------------

def _arrays(obj, seen=None):
    """Every NumPy array reachable from obj's attributes, lists, tuples and dicts."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _arrays(value, seen)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _arrays(value, seen)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("gpc"):
        yield from _arrays(vars(obj), seen)


@pytest.mark.parametrize("method", ["ep", "vi"])
def test_tied_sites_and_vi_keep_no_array_of_the_rows_length(method):
    """The fitted estimator (state, trainer, kernels) holds no array with a dimension of n: memory
    O(C m²) whatever n (the claim bench/bench_multiclass_sparse_memory.py measures)."""
    rng = np.random.default_rng(0)
    n = 997                                    # a length no other array has
    X = rng.normal(size=(n, 3))
    y = np.argmax(X @ rng.normal(size=(3, 3)), axis=1)
    kw = dict(tied_sites=True) if method == "ep" else {}
    clf = SparseMultiClassGPC(method=method, n_inducing=7, label_noise=0.05, batch_size=100,
                              max_iter=1, random_state=0, progress=False, **kw).fit(X, y)
    arrays = list(_arrays(clf))
    assert len(arrays) > 10                     # the walk reaches the state's arrays
    assert not [a.shape for a in arrays if n in a.shape]
