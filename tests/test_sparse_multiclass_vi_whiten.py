"""SparseMultiClassGPC(method="vi", whiten=False): q(u_k) = N(μ_k, L_kL_kᵀ) in u-space
(python/gpc/multiclass/sparse_vi.py, gpc.sparse.core.variational.svi_finish_u).

* the u-space bound's gradient in every class's θ, Z, q(u_k) and log ε against central
  differences;
* the two parametrisations give the same bound at corresponding q (μ_u = L μ_w, L_u = L L_w with
  K_uu = L Lᵀ), the same start (the prior), but another gradient in θ;
* with θ, Z and ε held, the bound's maximum over q is the same in both coordinates;
* the estimator: ``whiten`` must be True or False, and whiten=False fits.
"""

import numpy as np
import pytest
from scipy.optimize import minimize

from gpc import SparseMultiClassGPC
from gpc.kernels import RBF, ConstantKernel
from gpc.multiclass.sparse_vi import SparseMultiClassVIState
from helpers import central_differences
from test_sparse_multiclass_vi import _thyroid


def _problem(n=24, C=3, D=2, m=5, seed=1, shared=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    y = np.arange(n) % C
    y[0] = 1
    groups = 1 if shared else C
    Zs = [rng.normal(size=(m, D)) * 1.3 for _ in range(groups)]
    kernels = [ConstantKernel(1.0 + 0.2 * k) * RBF(np.linspace(0.8, 1.2, D) + 0.3 * k)
               for k in range(groups)]
    return X, y, kernels, Zs


def _state(kernels, Zs, n, C=3, whiten=True, learn_eps=True):
    return SparseMultiClassVIState(kernels, Zs, n, C, 0.05, (1e-6, 0.4) if learn_eps else None,
                                   1e-8, True, whiten=whiten)


def _q_slices(state):
    """Per class the slices of μ_k and of L_k's lower triangle in the packed parameters."""
    p = state.params()
    m = state.factors[0].m
    per = m + m * (m + 1) // 2
    start = len(p) - state.C * per
    return [(slice(start + k * per, start + k * per + m),
             slice(start + k * per + m, start + (k + 1) * per)) for k in range(state.C)]


def _random_q(state, seed=2):
    """The state's parameters with q away from its start: random means, random lower L."""
    rng = np.random.default_rng(seed)
    p = state.params()
    m = state.factors[0].m
    for mean_at, L_at in _q_slices(state):
        p[mean_at] = rng.normal(size=m)
        L = np.tril(0.3 * rng.normal(size=(m, m)), -1) + np.diag(rng.uniform(0.3, 0.9, m))
        p[L_at] = L[np.tril_indices(m)]
    return p


def _to_u(state_u, p_w):
    """p_w's q(w_k) carried to u-space through each class's factor: μ_u = L μ_w, L_u = L L_w."""
    p = p_w.copy()
    m = state_u.factors[0].m
    tril = np.tril_indices(m)
    for factor, (mean_at, L_at) in zip(state_u.factors, _q_slices(state_u)):
        Lw = np.zeros((m, m))
        Lw[tril] = p_w[L_at]
        p[mean_at] = factor.L @ p_w[mean_at]
        p[L_at] = (factor.L @ Lw)[tril]
    return p


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_unwhitened_bound_gradient_matches_central_differences(shared, scale):
    X, y, kernels, Zs = _problem(shared=shared)
    state = _state(kernels, Zs, len(y), whiten=False)
    p = _random_q(state)
    value, grad = state.objective(None, X, y, p, 7, scale=scale)    # blocks of 7 rows: 4 blocks
    assert np.isfinite(value) and grad.shape == p.shape
    fd = central_differences(lambda q: state.objective(None, X, y, q, 7, scale=scale)[0], p,
                             h=1e-6)
    # step h = 1e-6 on a bound of O(10²): central differences carry ~1e-8 of rounding and O(h²)
    # truncation; 1e-6 relative to each entry and to the gradient's largest entry covers both
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6 * np.max(np.abs(fd)))
    n_theta = sum(len(k.theta) for k in state.kernels)
    assert np.all(grad[:n_theta] != 0.0)


def test_the_bound_is_the_same_at_corresponding_q():
    """F_u(θ, L μ_w, L L_w) = F_w(θ, μ_w, L_w): the data terms see q through a_iᵀμ_w and
    |L_wᵀa_i|², and KL[q(u) ‖ N(0, K_uu)] = KL[q(w) ‖ N(0, I)].  The gradients in q are related by
    ∂F/∂μ_u = L⁻ᵀ ∂F/∂μ_w; the gradient in θ is another (q held in u, not in w)."""
    X, y, kernels, Zs = _problem()
    whitened = _state(kernels, Zs, len(y), whiten=True)
    unwhitened = _state(kernels, Zs, len(y), whiten=False)
    p_w = _random_q(whitened)
    p_u = _to_u(unwhitened, p_w)
    v_w, g_w = whitened.objective(None, X, y, p_w, 24)
    v_u, g_u = unwhitened.objective(None, X, y, p_u, 24)
    # two routes to O(10²) through m = 5 triangular products: rounding ~1e-13
    np.testing.assert_allclose(v_u, v_w, rtol=1e-12)
    for factor, (mean_at, _) in zip(unwhitened.factors, _q_slices(unwhitened)):
        np.testing.assert_allclose(g_u[mean_at], np.linalg.solve(factor.L.T, g_w[mean_at]),
                                   rtol=1e-9, atol=1e-12 * np.max(np.abs(g_w)))
    # log ε enters the data terms only: the same gradient
    eps_at = sum(len(k.theta) for k in kernels) + sum(Z.size for Z in Zs)
    np.testing.assert_allclose(g_u[eps_at], g_w[eps_at], rtol=1e-12)
    n_theta = sum(len(k.theta) for k in kernels)
    assert np.max(np.abs(g_u[:n_theta] - g_w[:n_theta])) > 1e-3 * np.max(np.abs(g_w[:n_theta]))


def test_both_start_at_the_prior():
    """whiten=False starts at q(u) = N(0, K_uu): the bound of whiten=True's N(0, I), no KL."""
    X, y, kernels, Zs = _problem()
    whitened = _state(kernels, Zs, len(y), whiten=True)
    unwhitened = _state(kernels, Zs, len(y), whiten=False)
    for factor, L in zip(unwhitened.factors, unwhitened.Lqs):
        np.testing.assert_array_equal(L, factor.L)
    v_w = whitened.objective(None, X, y, whitened.params(), 24)[0]
    v_u = unwhitened.objective(None, X, y, unwhitened.params(), 24)[0]
    np.testing.assert_allclose(v_u, v_w, rtol=1e-12)
    e, _, _ = unwhitened._block(np.ascontiguousarray(X), y)
    np.testing.assert_allclose(v_u, e, rtol=1e-12)


def _maximise_over_q(state, X, y, p0):
    """max over q of the bound at p0's θ, Z and ε (L-BFGS-B on q's entries alone)."""
    at = _q_slices(state)[0][0].start

    def negative(q):
        p = p0.copy()
        p[at:] = q
        value, grad = state.objective(None, X, y, p, len(y))
        return -value, -grad[at:]
    res = minimize(negative, p0[at:], jac=True, method="L-BFGS-B",
                   options=dict(maxiter=5000, maxfun=10000, ftol=1e-15, gtol=1e-9))
    return -res.fun, res


def test_the_maximum_over_q_does_not_depend_on_coordinates():
    """With θ, Z and ε held the two parametrisations are one bound in two coordinate systems
    (an invertible linear map of q's parameters), so the maxima agree: both climbed from their
    own start, the prior."""
    X, y, kernels, Zs = _problem(n=18, m=4)
    whitened = _state(kernels, Zs, len(y), whiten=True, learn_eps=False)
    unwhitened = _state(kernels, Zs, len(y), whiten=False, learn_eps=False)
    start = whitened.objective(None, X, y, whitened.params(), len(y))[0]
    best_w, res_w = _maximise_over_q(whitened, X, y, whitened.params())
    best_u, res_u = _maximise_over_q(unwhitened, X, y, unwhitened.params())
    assert best_w > start + 1.0                     # q moved well away from the prior
    # both stop at |projected gradient| ≤ 1e-9 or at a relative change 1e-15 of a bound of
    # O(10): the maxima agree to far better than 1e-7 relative
    np.testing.assert_allclose(best_u, best_w, rtol=1e-7)


@pytest.mark.parametrize("whiten", ["no", None, 0, 1.0])
def test_bad_whiten_raises(whiten):
    X, y, _, _ = _thyroid(60)
    clf = SparseMultiClassGPC(method="vi", label_noise=0.05, n_inducing=5, max_iter=1,
                              progress=False, whiten=whiten)
    with pytest.raises(ValueError, match="whiten must be True or False"):
        clf.fit(X, y)


def test_unwhitened_fit_on_thyroid():
    """whiten=False fits (another path than whiten=True: another model) and predicts well."""
    X, y, Xt, yt = _thyroid(150)
    kw = dict(method="vi", n_inducing=10, label_noise=0.02, max_iter=40, random_state=0,
              progress=False)
    u = SparseMultiClassGPC(whiten=False, **kw).fit(X, y)
    w = SparseMultiClassGPC(**kw).fit(X, y)
    assert u.get_params()["whiten"] is False and u._state.whiten is False
    assert u.score(Xt, yt) > 0.85 and np.isfinite(u.log_marginal_likelihood_value_)
    assert u.log_marginal_likelihood_value_ != w.log_marginal_likelihood_value_
    proba = u.predict_proba(Xt)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
