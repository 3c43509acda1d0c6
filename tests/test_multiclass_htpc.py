"""HTPC (gpc.multiclass.htpc): the hyperbolic-secant copula, the Laplace approximation's mode,
curvature and evidence against brute-force finite differences, its predictive moments against the
dense formula, and the estimator's model="heavy-tailed"."""

import numpy as np
import pytest
from scipy.special import ndtr

from gpc import MultiClassGPC
from gpc.kernels import RBF
from gpc.multiclass.htpc import (_dense_curvature, _gauss_newton_blocks, _likelihood_terms,
                                 htpc_laplace, htpc_latent_moments, secant_cdf, secant_transform)


def test_secant_copula_has_hyperbolic_secant_marginals_and_right_derivatives():
    u = np.linspace(-35, 35, 701)
    f, g1, g2 = secant_transform(u, 1.7)
    assert np.all(np.isfinite(f)) and np.all(np.isfinite(g1)) and np.all(np.isfinite(g2))
    # F_sech(g(u)) = Φ(u) is what "transformed to hyperbolic secant marginals" means; both sides are
    # computed independently (arctan∘exp against ndtr), so rounding only
    np.testing.assert_allclose(secant_cdf(f, 1.7), ndtr(u), atol=1e-14)
    assert np.all(np.diff(f) > 0)
    h = 1e-6    # central differences: truncation O(h²) ~ 1e-12 relative, rounding ~ 1e-10/h
    fp, g1p, _ = secant_transform(u + h, 1.7)
    fm, g1m, _ = secant_transform(u - h, 1.7)
    np.testing.assert_allclose((fp - fm) / (2 * h), g1, rtol=1e-6)
    np.testing.assert_allclose((g1p - g1m) / (2 * h), g2, rtol=1e-4, atol=1e-6)
    # the hyperbolic secant with scale b has variance b²: E g(u)² under u ~ N(0, 1) by Gauss–Hermite
    x, w = np.polynomial.hermite_e.hermegauss(200)
    assert np.sum(w * secant_transform(x, 0.8)[0] ** 2) / np.sqrt(2 * np.pi) == pytest.approx(0.64, rel=1e-3)


def test_secant_copula_derivatives_stay_finite_far_in_the_tails():
    """Beyond |u| ≈ 37, 1/sin(π Φ(−|u|)) overflows and φ(u) underflows; their product, the Mills-like
    ratio in g′ and g″, must not be formed from them (it gave inf · 0 = NaN in HTPC's Hessian)."""
    u = np.concatenate([-np.geomspace(1e3, 36.0, 60), np.geomspace(36.0, 1e3, 60)])
    with np.errstate(over="raise", invalid="raise"):
        f, g1, g2 = secant_transform(u, 1.3)
    assert np.all(np.isfinite(f)) and np.all(np.isfinite(g1)) and np.all(np.isfinite(g2))
    # for large |u|, g′(u) = 2b φ(u)/sin(πΦ(−|u|)) → 2b |u|/π (Mills ratio Φ(−a) ≈ φ(a)/a)
    np.testing.assert_allclose(g1[np.abs(u) > 500], 2 * 1.3 * np.abs(u[np.abs(u) > 500]) / np.pi,
                               rtol=1e-5)
    # g″ = −g′ (u + π φ cot(πΦ)) cancels: the bracket is ~1/u while its terms are ~u, so the ~1e-11
    # relative error of the log-space ratio becomes ~1e-11 u² relative in g″ (5e-5 at |u| = 1000);
    # checked where that is below 1e-6, |u| ≤ 300, by central differences (truncation (h/u)² ~ 1e-8)
    u = u[np.abs(u) <= 300]
    h = 1e-4 * np.abs(u)
    g1p = secant_transform(u + h, 1.3)[1]
    g1m = secant_transform(u - h, 1.3)[1]
    np.testing.assert_allclose((g1p - g1m) / (2 * h), secant_transform(u, 1.3)[2], rtol=1e-5)


def _problem(n=6, l=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = np.arange(n) % l
    K = 1.5 * RBF(1.0)(X) + 1e-8 * np.eye(n)
    return X, y, K


def test_likelihood_gradient_and_curvature_against_finite_differences():
    rng = np.random.default_rng(1)
    n, l = 5, 3
    U = rng.normal(size=(n, l))
    Y = np.zeros((n, l), bool)
    Y[np.arange(n), rng.integers(l, size=n)] = True
    b, scale = np.array([0.5, 1.0, 2.0]), rng.uniform(0.5, 2.0, n)
    _, grad, W, _ = _likelihood_terms(U, Y, b, scale)
    h = 1e-5    # central differences of smooth functions: error ~ h² ≈ 1e-10
    G, H = np.zeros_like(U), np.zeros((n * l, n * l))
    for k in range(l):
        for i in range(n):
            E = np.zeros_like(U)
            E[i, k] = h
            lp, gp, _, _ = _likelihood_terms(U + E, Y, b, scale)
            lm, gm, _, _ = _likelihood_terms(U - E, Y, b, scale)
            G[i, k] = (lp - lm) / (2 * h)
            H[:, k * n + i] = -((gp - gm) / (2 * h)).T.ravel()
    np.testing.assert_allclose(grad, G, atol=1e-8)
    np.testing.assert_allclose(_dense_curvature(W), H, atol=1e-8)


def test_laplace_mode_and_evidence_against_a_brute_force_hessian():
    """At û, ∇ log p(y | g(û)) = K⁻¹ û; the evidence is Ψ(û) − ½ log |K⁻¹ + H_lik| − ½ log |K| with
    the likelihood's Hessian taken here by finite differences of log p (not from W)."""
    X, y, K = _problem()
    n, l = len(y), 3
    b = np.array([0.7, 1.0, 1.4])
    res = htpc_laplace(K, y, l, b)
    assert res.converged
    Y = np.zeros((n, l), bool)
    Y[np.arange(n), y] = True
    scale = np.sqrt(np.diag(K))
    _, grad, _, _ = _likelihood_terms(res.u, Y, b, scale)
    np.testing.assert_allclose(grad, np.linalg.solve(K, res.u), atol=1e-7)   # Newton to 1e-8 on û
    h, H = 1e-4, np.zeros((n * l, n * l))   # second differences: error ~ h² · (4th derivative)
    flat = res.u.T.ravel()

    def loglik(v):
        return _likelihood_terms(v.reshape(l, n).T, Y, b, scale)[0]
    for p in range(n * l):
        for q in range(p, n * l):
            e_p, e_q = np.eye(n * l)[p] * h, np.eye(n * l)[q] * h
            H[p, q] = H[q, p] = -(loglik(flat + e_p + e_q) - loglik(flat + e_p - e_q)
                                  - loglik(flat - e_p + e_q) + loglik(flat - e_p - e_q)) / (4 * h * h)
    Kb = np.kron(np.eye(l), K)
    psi = loglik(flat) - 0.5 * flat @ np.linalg.solve(Kb, flat)
    brute = psi - 0.5 * np.linalg.slogdet(np.linalg.inv(Kb) + H)[1] - 0.5 * np.linalg.slogdet(Kb)[1]
    assert res.log_evidence == pytest.approx(brute, abs=1e-5)


def test_predictive_moments_against_the_dense_posterior():
    """κ* − Q*ᵀK⁻¹Q* + Q*ᵀK⁻¹(K⁻¹ + W)⁻¹K⁻¹Q* written out with dense inverses (tiny n), W the
    Gauss–Newton curvature at the mode: positive semi-definite, so the predictive covariance is at
    most the prior's κ* I (the full Hessian's g″ term can break both)."""
    X, y, K = _problem()
    n, l = len(y), 3
    res = htpc_laplace(K, y, l, np.ones(l))
    Xs = np.random.default_rng(3).normal(size=(4, 2))
    Kc, kd = 1.5 * RBF(1.0)(Xs, X), np.full(4, 1.5)
    mean, cov = htpc_latent_moments(res, Kc, kd)
    Kb_inv = np.linalg.inv(np.kron(np.eye(l), K))
    Y = np.zeros((n, l), bool)
    Y[np.arange(n), y] = True
    _, _, W_full, (d, w) = _likelihood_terms(res.u, Y, np.ones(l), np.sqrt(np.diag(K)))
    # the Gauss–Newton curvature: J (diag π − π πᵀ) J per point, from the full blocks without g″
    W_gn = _dense_curvature(_gauss_newton_blocks(d, w))
    assert np.linalg.eigvalsh(W_gn)[0] > -1e-12
    off = ~np.eye(n * l, dtype=bool)
    np.testing.assert_array_equal(_dense_curvature(W_full)[off], W_gn[off])   # g″ is diagonal
    np.testing.assert_array_equal(res.curvature, d)
    np.testing.assert_array_equal(res.coupling, w)
    Sigma = np.linalg.inv(Kb_inv + W_gn)
    for j in range(4):
        Q = np.kron(np.eye(l), Kc[j][:, None])                  # (n l, l)
        A = Q.T @ Kb_inv
        dense = kd[j] * np.eye(l) - A @ Q + A @ Sigma @ A.T
        np.testing.assert_allclose(cov[j], dense, atol=1e-8)
        np.testing.assert_allclose(mean[j], A @ res.u.T.ravel(), atol=1e-8)
        assert np.linalg.eigvalsh(kd[j] * np.eye(l) - cov[j])[0] > -1e-10


def test_estimator_heavy_tailed_fits_and_predicts():
    rng = np.random.default_rng(0)
    centres = 3.0 * np.array([[1, 0], [-0.5, 0.87], [-0.5, -0.87]])
    X = np.vstack([c + rng.normal(size=(10, 2)) for c in centres])
    y = np.repeat(np.arange(3), 10)
    clf = MultiClassGPC(model="heavy-tailed", kernel=RBF(1.0)).fit(X, y)
    assert clf.scales_.shape == (3,) and np.all(clf.scales_ > 0)
    assert clf.noise_ is None and np.all(clf.outlier_probability_ == 0)
    P = clf.predict_proba(X)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=1e-12)
    assert np.mean(clf.predict(X) == y) > 0.9
    # the optimiser's gradient (forward differences, step 1e-5) against central differences of the
    # evidence away from the optimum; the forward step's bias is ~ 1e-5 × the curvature, hence 1e-3
    theta = clf.theta_ + np.array([0.3, -0.2, 0.1, 0.2])
    _, grad = clf._evidence(theta, X, y)
    h = 1e-4
    central = [(clf._evidence(theta + h * e, X, y, eval_gradient=False).log_evidence
                - clf._evidence(theta - h * e, X, y, eval_gradient=False).log_evidence) / (2 * h)
               for e in np.eye(theta.size)]
    np.testing.assert_allclose(grad, central, rtol=1e-3, atol=1e-3)
    assert np.max(np.abs(central)) > 0.01       # away from the optimum the check is not vacuous
    with pytest.raises(ValueError, match="shared_kernel"):
        MultiClassGPC(model="heavy-tailed", shared_kernel=False).fit(X, y)


def test_laplace_leaves_the_symmetric_saddle():
    """scikit-learn's check_classifiers_train problem (two standardised blobs of 100 points, l = 2):
    Newton from u = 0 converges to the symmetric point u₁ = −u₂, a saddle of Ψ (g′ is smallest at 0;
    −∇²Ψ had an eigenvalue −0.34 there).  The approximation must end at a maximum, where −∇²Ψ in
    whitened coordinates is positive definite."""
    datasets = pytest.importorskip("sklearn.datasets")
    from gpc._linalg import cholesky_lower
    from gpc.multiclass.htpc import _whitened_hessian
    X, y = datasets.make_blobs(n_samples=300, random_state=0)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    X, y = X[y != 2], y[y != 2]
    n = len(y)
    K = RBF(1.0)(X)
    res = htpc_laplace(K, y, 2, np.ones(2))
    assert res.converged
    Y = np.zeros((n, 2), bool)
    Y[np.arange(n), y] = True
    L = cholesky_lower(K)[0]
    _, _, W, _ = _likelihood_terms(res.u, Y, np.ones(2), np.ones(n))
    assert np.linalg.eigvalsh(_whitened_hessian(W, L, n, 2))[0] > 0
    assert not np.allclose(res.u[:, 0], -res.u[:, 1], atol=1e-3)   # not the symmetric point


def _blob_data(n, l, seed=0):
    rng = np.random.default_rng(seed)
    centres = 3.0 * np.column_stack([np.cos(2 * np.pi * np.arange(l) / l),
                                     np.sin(2 * np.pi * np.arange(l) / l)])
    X = np.vstack([c + rng.normal(size=(n // l, 2)) for c in centres])
    return X, np.repeat(np.arange(l), n // l)


def test_fitted_model_keeps_no_nl_squared_matrix():
    """The pickled fitted model holds K, l class factors and one coupling factor, (l + 2) n² doubles,
    not the (n l)² curvature and solve matrices (three of them, 3 l² n², before)."""
    import pickle
    l = 4
    for n in (40, 80):
        X, y = _blob_data(n, l)
        clf = MultiClassGPC(model="heavy-tailed", optimizer=None).fit(X, y)
        size = len(pickle.dumps(clf))
        # (l + 2) n² doubles, plus O(n l) vectors, X and the pickle's own overhead (< 32 kB)
        assert size < 8 * (l + 2) * n * n + 8 * 16 * n * l + 32_000
        assert size < 8 * (n * l) ** 2          # less than one (n l)² matrix
        assert clf.predict_proba(X).shape == (n, l)


@pytest.mark.parametrize("threads_from", [0, 10_000])
def test_fit_and_prediction_follow_the_thread_policy(monkeypatch, threads_from):
    """HTPC's BLAS runs on n_jobs threads during the fit and the prediction (None: as many as BLAS
    may use when the fit starts, joblib's convention as on every gpc estimator) when n l reaches
    the thread policy's HTPC size (gpc._threads.RULES), and on one thread below it; never on a
    count the caller did not choose."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from gpc import _threads
    from gpc.multiclass import htpc

    seen, laplace, moments = [], htpc._laplace, htpc.htpc_latent_moments
    monkeypatch.setitem(_threads.RULES, "htpc", threads_from)

    def blas_threads():
        return {info["num_threads"] for info in threadpoolctl.threadpool_info()
                if info["user_api"] == "blas"}

    def spy_laplace(*args):
        seen.append(("fit", blas_threads()))
        return laplace(*args)

    def spy_moments(*args):
        seen.append(("predict", blas_threads()))
        return moments(*args)

    monkeypatch.setattr(htpc, "_laplace", spy_laplace)
    monkeypatch.setattr(htpc, "htpc_latent_moments", spy_moments)
    X, y = _blob_data(30, 3)                # n l = 90
    from gpc._estimator import resolve_n_jobs
    for n_jobs, limit, want in ((None, None, {resolve_n_jobs(None)}), (None, 1, {1}),
                                (1, None, {1}), (2, 1, {2})):
        if threads_from > 90:
            want = {1}
        seen.clear()
        with threadpoolctl.threadpool_limits(limit):
            clf = MultiClassGPC(model="heavy-tailed", optimizer=None, n_jobs=n_jobs).fit(X, y)
            clf.predict_proba(X[:5])
        assert [s for _, s in seen] == [want, want]
