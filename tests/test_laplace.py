"""Laplace approximation: the claims of R&W §3.4 / Alg. 3.1, 5.1 and NR eq. (9)-(10), checked."""

import numpy as np
import pytest
from scipy import integrate, optimize

from gpc.exceptions import ConvergenceWarning, NotPositiveDefiniteError
from gpc.inference import infer, laplace
from gpc.likelihoods import Logit, NoisyThreshold, Probit, Heaviside
from reference_laplace import laplace_reference

def rbf(X, ell=1.0, sf2=1.0):
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    return sf2 * np.exp(-0.5 * d2 / ell**2)

def problem(n, seed, d=2):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.where(X[:, 0] + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y

@pytest.mark.parametrize("lik", [Logit(), Probit()], ids=["logit", "probit"])
@pytest.mark.parametrize("with_mean", [False, True])
def test_matches_slow_reference(lik, with_mean):
    # Same formulas, different Newton paths and stopping rules (here: ΔΨ < 1e-14 with a chord bound;
    # the reference: Δf < 1e-13), so the two modes agree to ~1e-9 (atol on the mean).  The evidence
    # is stationary in f̂ up to log|B|, so 1e-8 holds for it; the gradient moves with f̂ at first
    # order (measured: modes 3e-10 apart give 1.2e-8 relative with probit, while each code agrees
    # with 50-digit arithmetic at its own mode to 2e-11), hence rtol 1e-7 on the gradient.
    X, y = problem(30, 1)
    ell, sf2 = 1.3, 2.5
    K = rbf(X, ell, sf2)
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    dK = np.stack([K, K * d2 / ell**2], axis=2)  # ∂K/∂log sf2, ∂K/∂log ell
    m0 = np.linspace(-0.5, 0.5, 30) if with_mean else None
    f_ref, lz_ref, g_ref = laplace_reference(K, y, lik.log_prob_derivatives, dK, m0)
    # tol 1e-14 on Ψ (|Ψ| ~ 20, so a few ulps): the mode is then at Newton's fixed point
    r = infer(K, y, likelihood=lik, method="laplace", prior_mean=m0, tol=1e-14)
    assert r.converged
    np.testing.assert_allclose(r.mean, f_ref, rtol=0, atol=1e-8)
    assert abs(r.log_evidence - lz_ref) < 1e-8
    g = r.log_evidence_gradient(lambda M: np.einsum("ij,ijk->k", M, dK))
    np.testing.assert_allclose(g, g_ref, rtol=1e-7, atol=1e-10)

@pytest.mark.parametrize("lik, ell, sf2", [(Logit(), 1.0, 3.0), (Probit(), 1.0, 3.0),
                                           (Logit(), 0.3, 50.0)],
                         ids=["logit", "probit", "logit-short-length-scale"])
def test_large_problem_path_matches_slow_reference(lik, ell, sf2):
    # n >= 1000 takes the other path: a subset start, chord steps with the Nyström Newton matrix,
    # then with a single-precision factor of B once those stop gaining (the short length scale),
    # all Anderson-accelerated.  That path ends linearly, just past tol, not quadratically: at tol
    # 1e-14 the mode is measured 4e-8 from the reference's, the evidence 3e-8, the gradient 8e-9
    # relative; the tolerances below leave a factor 25 for other BLAS builds.
    n = 1200
    X, y = problem(n, 4)
    K = rbf(X, ell, sf2)
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    dK = np.stack([K, K * d2 / ell**2], axis=2)
    K = K + 1e-8 * np.eye(n)
    f_ref, lz_ref, g_ref = laplace_reference(K, y, lik.log_prob_derivatives, dK, None)
    r = infer(K, y, likelihood=lik, method="laplace", tol=1e-14)
    assert r.converged
    np.testing.assert_allclose(r.mean, f_ref, rtol=0, atol=1e-6)
    assert abs(r.log_evidence - lz_ref) < 1e-6
    g = r.log_evidence_gradient(lambda M: np.einsum("ij,ijk->k", M, dK))
    np.testing.assert_allclose(g, g_ref, rtol=2e-7)


@pytest.mark.parametrize("ell, sf2, falls_back", [(1.0, 3.0, False), (0.3, 50.0, True),
                                                  (3.0, 1000.0, True)],
                         ids=["smooth", "short-length-scale", "smooth-large-amplitude"])
def test_nystrom_chord_steps_need_no_factor_of_b_for_a_smooth_kernel(ell, sf2, falls_back,
                                                                      monkeypatch):
    # at n >= 1000 the first Newton matrix is the Nyström one; on a smooth kernel its chord steps
    # reach the mode (default tol) with no O(n³) factor before the evidence's; with a short length
    # scale the subset no longer spans K, the steps stop gaining, and B is factored after all; so
    # with a smooth K of large amplitude (K_SS + K_Sn W K_nS then needs jitter, and the small
    # eigenvalues it drops are amplified by σ_f² = 1000)
    n = 1200
    built = []
    for name in ("_NystromMatrix", "_NewtonMatrix"):
        cls = getattr(laplace, name)

        def init(self, K, *args, _cls=cls, _name=name):
            built.append((_name, K.shape[0]))
            _cls.__init__(self, K, *args)
        monkeypatch.setattr(laplace, name, type(name, (cls,), {"__init__": init}))
    X, y = problem(n, 4)
    r = infer(rbf(X, ell, sf2) + 1e-8 * np.eye(n), y, likelihood="logit", method="laplace")
    assert r.converged
    full_size = [name for name, size in built if size == n]
    assert full_size[0] == "_NystromMatrix"
    assert ("_NewtonMatrix" in full_size) == falls_back


def test_newton_matrix_is_the_factored_b_when_the_nystrom_one_cannot_be_formed(monkeypatch):
    # K_SS + K_Sn W K_nS not positive definite even with jitter: Newton factors B (float32) instead,
    # in a buffer it allocates
    def refuse(K, W):
        raise NotPositiveDefiniteError("K_SS + K_Sn W K_nS is not positive definite")
    monkeypatch.setattr(laplace, "_NystromMatrix", refuse)
    X, y = problem(40, 2)
    K, W = rbf(X), np.full(40, 0.2)
    newton, buffer = laplace._newton_matrix(K, W, True, None)
    assert isinstance(newton, laplace._NewtonMatrix) and buffer.shape == (40, 40)
    r = np.linspace(-1.0, 1.0, 40)
    expected = np.linalg.solve(np.eye(40) + W[:, None] * K, r)
    # float32 factor: error ~ 6e-8 x cond(B), cond(B) <= 1 + 0.2 x 40 here, so rtol 1e-5
    np.testing.assert_allclose(newton.step(r, K @ r), expected, rtol=1e-5)


def test_nystrom_newton_step_is_the_woodbury_solve():
    # (I + W K̃)⁻¹ r with K̃ = K_nS K_SS⁻¹ K_Sn on every NYSTROM_STRIDE-th point, against a dense
    # solve; K_SS's condition number here is 7e3 (ℓ = 0.3), so both lose ~4 of 16 digits: rtol 1e-9
    n = 240
    X, _ = problem(n, 7)
    K = rbf(X, 0.3, 2.0)
    W = np.random.default_rng(7).uniform(0.01, 0.25, n)
    S = np.arange(0, n, laplace.NYSTROM_STRIDE)
    K_tilde = K[:, S] @ np.linalg.solve(K[np.ix_(S, S)], K[S])
    r = np.random.default_rng(8).normal(size=n)
    expected = np.linalg.solve(np.eye(n) + W[:, None] * K_tilde, r)
    np.testing.assert_allclose(laplace._NystromMatrix(K, W).step(r, None), expected, rtol=1e-9)


@pytest.mark.parametrize("lik", [Logit(), Probit()], ids=["logit", "probit"])
def test_gradient_matches_finite_differences(lik):
    # central differences with step 1e-5 on log θ: truncation O(h²) ~ 1e-10 relative, rounding
    # ~ 1e-16 |log Z| / h ~ 1e-9; tolerance 1e-6 relative covers both with margin.  Newton runs to
    # tol 1e-14 here: log|B| depends on f̂ to first order, so an f̂ converged only to the default
    # (|ΔΨ| < 1e-10, f̂ to ~1e-6) would put ~1e-6/h of noise into the differences.
    X, y = problem(40, 2)
    y[:3] *= -1  # some label noise so the mode is interior

    def evidence(theta):
        return infer(rbf(X, np.exp(theta[1]), np.exp(theta[0])), y, likelihood=lik, tol=1e-14).log_evidence

    theta = np.array([np.log(3.0), np.log(0.8)])
    K = rbf(X, 0.8, 3.0)
    d2 = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    dK = np.stack([K, K * d2 / 0.8**2], axis=2)
    g = infer(K, y, likelihood=lik, tol=1e-14).log_evidence_gradient(lambda M: np.einsum("ij,ijk->k", M, dK))
    h = 1e-5
    fd = [(evidence(theta + h * e) - evidence(theta - h * e)) / (2 * h) for e in np.eye(2)]
    np.testing.assert_allclose(g, fd, rtol=1e-6)

def test_gradient_matrix_overwrites_the_factor_and_prediction_refactors():
    # The evidence gradient inverts B's factor in place; the posterior then refactors on demand, so
    # a prediction after a gradient (and a second gradient) equals one before: both refactor the
    # same B, hence to rounding (1e-12).
    X, y = problem(60, 5)
    K = rbf(X, 0.9, 2.0)
    Kx, kd = rbf(np.vstack([X, X[:7] + 0.1]), 0.9, 2.0)[:60, 60:], np.full(7, 2.0)
    r = infer(K, y, likelihood=Logit(), method="laplace")
    before = r.predict(Kx, kd)
    log_det = r.posterior.log_det_B
    M1 = r.gradient_matrix()
    assert r.posterior._L is None
    after = r.predict(Kx, kd)
    M2 = r.gradient_matrix()
    for b, a in zip(before, after):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_allclose(M2, M1, rtol=1e-12, atol=1e-14 * np.abs(M1).max())
    assert abs(r.posterior.log_det_B - log_det) < 1e-12 * abs(log_det)


def test_mode_is_the_argmax_of_the_exact_posterior():
    # n = 3: the Laplace mean must be the maximiser of log p(y|f) + log N(f|0, K), found here by a
    # general-purpose optimiser to its tolerance (gtol 1e-10 → f to ~1e-8).
    X, y = problem(3, 3)
    K = rbf(X, 1.0, 2.0)
    lik = Logit()
    Kinv = np.linalg.inv(K)

    def neg_log_post(f):
        lp, d1, _, _ = lik.log_prob_derivatives(y, f)
        return -(lp.sum() - 0.5 * f @ Kinv @ f), -(d1 - Kinv @ f)

    res = optimize.minimize(neg_log_post, np.zeros(3), jac=True, method="BFGS", options={"gtol": 1e-10})
    r = infer(K, y, likelihood=lik, tol=1e-14)
    np.testing.assert_allclose(r.mean, res.x, atol=1e-7)

@pytest.mark.parametrize("k", [0.05, 0.5, 4.0])
def test_one_point_against_quadrature(k):
    # n = 1: log Z = log ∫ Φ(f) N(f|0,k) df exactly (= log Φ(0) for a symmetric prior, here with a
    # prior mean to break the symmetry).  Laplace is exact to second order: its error must shrink
    # with the prior variance (the posterior becomes Gaussian), and its mode is the 1-D argmax.
    lik = Probit()
    m0 = np.array([0.3])
    y = np.array([1.0])
    exact = np.log(integrate.quad(lambda f: np.exp(lik.log_prob(y, np.array([f]))[0])
                                  * np.exp(-0.5 * (f - 0.3) ** 2 / k) / np.sqrt(2 * np.pi * k),
                                  -np.inf, np.inf, epsabs=1e-14)[0])
    r = infer(np.array([[k]]), y, likelihood=lik, prior_mean=m0, tol=1e-14)
    mode = optimize.minimize_scalar(lambda f: -(lik.log_prob(y, np.array([f]))[0] - 0.5 * (f - 0.3) ** 2 / k),
                                    bracket=(-5, 5), tol=1e-12).x
    assert abs(r.mean[0] - mode) < 1e-6
    # the error of Laplace grows with k; these bounds are about 3x the errors seen
    assert abs(r.log_evidence - exact) < {0.05: 1e-3, 0.5: 2e-2, 4.0: 0.15}[k]

def test_laplace_refuses_step_likelihoods():
    K = np.eye(3)
    y = np.array([1.0, -1.0, 1.0])
    for lik in (NoisyThreshold(0.1), Heaviside()):
        with pytest.raises(ValueError, match="gradient"):
            infer(K, y, likelihood=lik, method="laplace")

def test_iteration_limit_warns_and_reports():
    X, y = problem(50, 4)
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        r = infer(rbf(X, 1.0, 10.0), y, likelihood="logit", max_iter=1)
    assert r.n_iter == 1 and not r.converged

@pytest.mark.parametrize("n", [80, 1200])        # 1200: the subset start and chord steps
def test_converged_mode_leaves_less_than_tol_for_a_newton_step(n):
    # the stopping rule: a further Newton step could gain at most ½ rᵀ K r < tol (r = ∇Ψ)
    X, y = problem(n, 3)
    K = rbf(X, 1.0, 4.0)
    tol = 1e-9
    r = infer(K, y, likelihood="logit", tol=tol)
    grad = Logit().log_prob_derivatives(y, r.info["f"])[1] - r.info["a"]
    assert r.converged and 0.5 * grad @ K @ grad < tol


def test_warm_start_reaches_the_same_mode_in_fewer_steps():
    X, y = problem(60, 5)
    # tol 1e-13 so that both runs end at the same mode to ~1e-10 and the evidences agree to 1e-9
    cold = infer(rbf(X, 1.0, 5.0), y, likelihood="logit", tol=1e-13)
    warm = infer(rbf(X, 1.05, 5.0), y, likelihood="logit", init=cold, tol=1e-13)
    again = infer(rbf(X, 1.05, 5.0), y, likelihood="logit", tol=1e-13)
    assert abs(warm.log_evidence - again.log_evidence) < 1e-9
    assert warm.n_iter < again.n_iter

@pytest.mark.parametrize("bad, match", [
    (lambda K, y: (K[:, :2], y), "square"),
    (lambda K, y: (K, y[:3]), "labels"),
    (lambda K, y: (K, np.where(y > 0, 1.0, 0.0)), "-1 and \\+1"),
    (lambda K, y: (np.where(np.eye(len(y)) > 0, np.nan, K), y), "NaN"),
    (lambda K, y: (K + np.triu(np.ones_like(K), 1), y), "symmetric"),
    (lambda K, y: (K - 3 * np.eye(len(y)), y), "not positive definite"),
])
def test_bad_input_is_named(bad, match):
    X, y = problem(5, 6)
    K, y2 = bad(rbf(X), y)
    with pytest.raises(ValueError, match=match):
        infer(K, y2, likelihood="logit")

def test_not_positive_definite_is_its_own_error():
    with pytest.raises(NotPositiveDefiniteError):
        infer(-np.eye(2), np.array([1.0, -1.0]))

def test_unknown_method_lists_the_available_ones():
    with pytest.raises(ValueError, match="laplace"):
        infer(np.eye(2), np.array([1.0, -1.0]), method="magic")


def test_jittered_retry_starts_from_the_matrix_not_its_half_factored_remains():
    # cholesky_lower(overwrite=True) factors in place; when the unjittered attempt fails, A is half
    # overwritten, so the retries must rebuild it.  A slightly indefinite A (eigenvalue -1e-9) is
    # factored with a 1e-8 jitter; before the fix the retries ran on the remains and raised.
    from gpc._linalg import cholesky_lower
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.normal(size=(50, 50)))
    A = Q @ np.diag(np.r_[np.ones(49), -1e-9]) @ Q.T
    L, jitter = cholesky_lower(A.copy(), overwrite=True, rebuild=A.copy)
    assert 0 < jitter < 1e-7
    np.testing.assert_allclose(L @ L.T, A + jitter * np.eye(50), atol=1e-12)
    with pytest.raises(NotPositiveDefiniteError, match="not positive definite"):
        cholesky_lower(A.copy(), overwrite=True)      # no way to rebuild: no retries, a clear error
