"""Likelihood moments against brute-force quadrature, finite differences and limits.

Quadrature references use scipy.integrate.quad on [m - 12 sd, m + 12 sd] (the Gaussian mass
outside is < 1e-32) with a breakpoint at the step/transition f = 0, epsrel = 1e-12.  quad's own
accuracy on these smooth-or-split integrands is ~1e-13, so closed forms are held to 1e-9 and the
quadrature-based kernels (logit; probit expected_log_prob) to what their rule achieves, stated
at each test.
"""

import pickle
import warnings

import numpy as np
import pytest
from scipy import integrate, special

from gpc import _likelihoods as core
from gpc.likelihoods import (Heaviside, Logit, NoisyThreshold, Probit,
                             get_likelihood)

MEANS = np.linspace(-5.0, 5.0, 5)
VARS = np.array([0.01, 0.3, 1.0, 3.0, 100.0])
GRID = [(y, m, v) for y in (1.0, -1.0) for m in MEANS for v in VARS]
LIKS = [Probit(), Logit(), NoisyThreshold(0.05), Heaviside()]
IDS = [lik.name for lik in LIKS]


def p_plus(lik, f):
    """p(y=+1 | f), straight from PL eq. (1)-(3); H(0) = 1/2."""
    if lik.name == "probit":
        return special.ndtr(f)
    if lik.name == "logit":
        return special.expit(f)
    eps = lik.eps if lik.name == "noisy_threshold" else 0.0
    return eps + (1 - 2 * eps) * np.heaviside(f, 0.5)


def quad(g, m, v):
    sd = np.sqrt(v)
    lo, hi = m - 12 * sd, m + 12 * sd
    pts = [0.0] if lo < 0 < hi else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return integrate.quad(lambda f: g(f) * np.exp(-0.5 * (f - m) ** 2 / v) / np.sqrt(2 * np.pi * v),
                              lo, hi, points=pts, limit=400, epsabs=0, epsrel=1e-12)[0]


def ref_tilted(lik, y, m, v):
    lik_f = lambda f: p_plus(lik, y * f)
    z = quad(lik_f, m, v)
    mu = quad(lambda f: f * lik_f(f), m, v) / z
    var = quad(lambda f: (f - mu) ** 2 * lik_f(f), m, v) / z
    return np.log(z), mu, var


def as_arrays(grid):
    y, m, v = (np.array(c) for c in zip(*grid))
    return y, m, v


@pytest.mark.parametrize("lik", LIKS, ids=IDS)
def test_tilted_moments_against_quad(lik):
    # Closed forms (probit, steps): 1e-9.  Logit: GH order 48 (v <= 1) and the step + 48-node
    # Gauss-Laguerre split (v > 1) measured at <= 1e-13 against quad; 1e-9 leaves margin.
    # Heaviside with y m / sqrt(v) < -8: Z < 1e-15 and quad of the unnormalised integrand is
    # meaningless there; those points are checked in log space by test_tail_log_z_in_log_space.
    grid = [g for g in GRID if lik.name != "heaviside" or g[0] * g[1] / np.sqrt(g[2]) > -8]
    y, m, v = as_arrays(grid)
    lz, mu, var = lik.tilted_moments(y, m, v)
    ref = np.array([ref_tilted(lik, *g) for g in grid])
    np.testing.assert_allclose(lz, ref[:, 0], rtol=0, atol=1e-9)
    np.testing.assert_allclose((mu - ref[:, 1]) / np.sqrt(v), 0, atol=1e-9)
    np.testing.assert_allclose((var - ref[:, 2]) / v, 0, atol=1e-9)


@pytest.mark.parametrize("lik", LIKS, ids=IDS)
def test_slr_moments_against_quad(lik):
    # Same tolerances and reasons as the tilted moments.  E(y|f) = 2 p(+1|f) - 1 (PL supplement).
    grid = [(m, v) for m in MEANS for v in VARS]
    m, v = (np.array(c) for c in zip(*grid))
    mu_y, cov, var_y = lik.slr_moments(m, v)
    ey = lambda f: 2 * p_plus(lik, f) - 1
    for i, (mi, vi) in enumerate(grid):
        r_mu = quad(ey, mi, vi)
        r_cov = quad(lambda f: (f - mi) * ey(f), mi, vi)
        assert abs(mu_y[i] - r_mu) < 1e-9
        assert abs(cov[i] - r_cov) < 1e-9 * max(1.0, np.sqrt(vi))
    # Var[y] of a +-1 label with mean mu_y is 1 - mu_y^2 (not the supplement's literal 1 - alpha^2)
    np.testing.assert_allclose(var_y, 1 - mu_y ** 2, atol=1e-14)


@pytest.mark.parametrize("lik", LIKS, ids=IDS)
def test_predictive_probability_against_quad(lik):
    grid = [(m, v) for m in MEANS for v in VARS]
    m, v = (np.array(c) for c in zip(*grid))
    p = lik.predictive_probability(m, v)
    ref = [quad(lambda f: p_plus(lik, f), mi, vi) for mi, vi in grid]
    np.testing.assert_allclose(p, ref, atol=1e-9)
    mu_y = lik.slr_moments(m, v)[0]
    np.testing.assert_allclose(mu_y, 2 * p - 1, atol=1e-12)


@pytest.mark.parametrize("lik", [Probit(), Logit(), NoisyThreshold(0.05)], ids=IDS[:3])
def test_expected_log_prob_against_quad_and_fd(lik):
    # Logit: exact split for v > 1, GH-48 below: 1e-9.  Noisy threshold: closed form: 1e-9.
    # Probit: Gauss-Hermite only; measured relative error 4.2e-4 at order 48 on v = 100
    # (log Phi bends over a unit scale that GH under a sd-10 Gaussian barely resolves), 1e-9 for v <= 1.
    y, m, v = as_arrays(GRID)
    e, dm, dv = lik.expected_log_prob(y, m, v)
    for i, (yi, mi, vi) in enumerate(GRID):
        ref = quad(lambda f: np.log(p_plus(lik, yi * f)), mi, vi)
        tol = 1e-9 if (lik.name != "probit" or vi <= 1.0) else 1e-3
        assert abs(e[i] - ref) <= tol * max(1.0, abs(ref)), (yi, mi, vi, e[i], ref)
    # derivatives against central differences of the kernel's own value.  For probit with v > 3
    # the GH values of E, E[g'] and E[g''] are each only ~1e-3 accurate, so they are not
    # consistent to FD precision there (known limitation, see docs/derivations.md).
    if lik.name == "probit":
        keep = v <= 3.0
        y, m, v, dm, dv = y[keep], m[keep], v[keep], dm[keep], dv[keep]
    h = 1e-5
    ep = lik.expected_log_prob(y, m + h, v)[0]
    em = lik.expected_log_prob(y, m - h, v)[0]
    np.testing.assert_allclose(dm, (ep - em) / (2 * h), rtol=1e-5, atol=1e-6)
    hv = 1e-5 * v
    ep = lik.expected_log_prob(y, m, v + hv)[0]
    em = lik.expected_log_prob(y, m, v - hv)[0]
    np.testing.assert_allclose(dv, (ep - em) / (2 * hv), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("lik", [Probit(), Logit()], ids=IDS[:2])
def test_log_prob_derivatives_fd(lik):
    f = np.linspace(-8, 8, 41)
    for yv in (1.0, -1.0):
        y = np.full_like(f, yv)
        lp, d1, d2, d3 = lik.log_prob_derivatives(y, f)
        np.testing.assert_allclose(lp, np.log(p_plus(lik, y * f)), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(lik.log_prob(y, f), lp, rtol=0, atol=0)
        h = 1e-5
        up = lik.log_prob_derivatives(y, f + h)
        dn = lik.log_prob_derivatives(y, f - h)
        for k, d in ((0, d1), (1, d2), (2, d3)):
            np.testing.assert_allclose(d, (up[k] - dn[k]) / (2 * h), rtol=1e-6, atol=1e-8)


def test_probit_derivatives_far_tail():
    # t = y f = -40: log Phi(t) ~ -t^2/2 - log(-t) - log sqrt(2 pi) - 1/t^2;  r = -t + 1/(-t) - 2/(-t)^3
    f = np.array([-40.0, 40.0])
    y = np.array([1.0, -1.0])
    lp, d1, d2, d3 = Probit().log_prob_derivatives(y, f)
    t = -40.0
    x = 1 / t ** 2   # log(1 - x + 3x^2 - 15x^3) = -x + 5/2 x^2 - 37/3 x^3 + O(x^4)
    ref_lp = -t * t / 2 - np.log(-t) - 0.5 * np.log(2 * np.pi) - x + 2.5 * x ** 2 - 37 / 3 * x ** 3
    np.testing.assert_allclose(lp, ref_lp, rtol=1e-12)
    r = -t + 1 / (-t) - 2 / (-t) ** 3 + 10 / (-t) ** 5
    np.testing.assert_allclose(d1 * y, r, rtol=1e-10)
    assert np.all(np.isfinite(d2)) and np.all(d2 < 0) and np.all(np.isfinite(d3))
    np.testing.assert_allclose(d2, -(1 - 1 / t ** 2), rtol=1e-3)


@pytest.mark.parametrize("lik", LIKS, ids=IDS)
def test_tails_finite(lik):
    m = np.array([-40.0, 40.0, -40.0, 40.0, 0.0, -40.0, 40.0])
    v = np.array([0.01, 0.01, 100.0, 100.0, 1e4, 1e-8, 1e-8])
    for yv in (1.0, -1.0):
        y = np.full_like(m, yv)
        for out in (lik.tilted_moments(y, m, v), lik.slr_moments(m, v),
                    (lik.predictive_probability(m, v),)):
            for a in out:
                assert np.all(np.isfinite(a))
        lz, mu, var = lik.tilted_moments(y, m, v)
        assert np.all(var > 0) and np.all(lz <= 0)
        if lik.log_concave:   # log-concave likelihoods shrink the variance; the steps may not
            assert np.all(var <= v * (1 + 1e-12))


@pytest.mark.parametrize("lik", [Probit(), Logit(), Heaviside()], ids=["probit", "logit", "heaviside"])
def test_tail_log_z_in_log_space(lik):
    # wrong side, m = -40 (y = +1): compare log Z with quad of the integrand scaled by exp(-shift)
    for v in (0.01, 1.0, 100.0):
        lz = lik.tilted_moments([1.0], [-40.0], [v])[0][0]
        if lik.name == "heaviside" or lik.name == "probit":
            s = 1.0 + v if lik.name == "probit" else v
            ref = special.log_ndtr(-40.0 / np.sqrt(s))          # exact closed form in log space
        else:
            # log sigma(f) - (f + 40)^2/(2v) integrated with the max subtracted
            g = lambda f: -np.logaddexp(0, -f) - 0.5 * (f + 40) ** 2 / v
            fs = np.linspace(-40 - 12 * np.sqrt(v), -40 + 12 * np.sqrt(v) + 1, 20001)
            gmax = g(fs).max()
            val = integrate.quad(lambda f: np.exp(g(f) - gmax), fs[0], fs[-1], limit=400,
                                 epsabs=0, epsrel=1e-12)[0]
            ref = gmax + np.log(val) - 0.5 * np.log(2 * np.pi * v)
        assert abs(lz - ref) < 1e-9 * max(1.0, abs(ref)), (v, lz, ref)


def test_heaviside_is_noisy_threshold_limit():
    # the limit holds where Phi(y m / sqrt v) >> eps; deeper on the wrong side Z ~ eps instead
    y, m, v = as_arrays([g for g in GRID if g[0] * g[1] / np.sqrt(g[2]) > -4])
    h = Heaviside()
    nt = NoisyThreshold(1e-15)
    for a, b in zip(h.tilted_moments(y, m, v), nt.tilted_moments(y, m, v)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)   # error ~ eps / Phi(z) <= 4e-11, times <= 1e2 cancellation in var
    for a, b in zip(h.slr_moments(m, v), nt.slr_moments(m, v)):
        np.testing.assert_allclose(a, b, atol=1e-10)
    np.testing.assert_allclose(h.predictive_probability(m, v), nt.predictive_probability(m, v), atol=1e-10)


def test_probit_slr_closed_form_identity():
    # PL supplement: cov = 2 v / sqrt(1 + v) N(m / sqrt(1 + v)); mu_y = 2 alpha - 1
    m = np.array([0.3, -2.0]); v = np.array([0.5, 4.0])
    mu, cov, var_y = Probit().slr_moments(m, v)
    alpha = special.ndtr(m / np.sqrt(1 + v))
    np.testing.assert_allclose(mu, 2 * alpha - 1, rtol=1e-14)
    np.testing.assert_allclose(var_y, 4 * alpha * (1 - alpha), rtol=1e-13)


def test_steps_reject_laplace_and_heaviside_rejects_elog():
    for lik in (NoisyThreshold(0.1), Heaviside()):
        with pytest.raises(ValueError, match="zero almost everywhere"):
            lik.log_prob_derivatives([1.0], [0.5])
    with pytest.raises(ValueError, match="log 0"):
        Heaviside().expected_log_prob([1.0], [0.0], [1.0])


@pytest.mark.parametrize("bad, match", [
    (dict(y=[0.0], m=[0.0], v=[1.0]), "labels"),
    (dict(y=[1.0], m=[np.nan], v=[1.0]), "NaN"),
    (dict(y=[1.0], m=[0.0], v=[0.0]), "> 0"),
    (dict(y=[1.0], m=[0.0], v=[-1.0]), "> 0"),
    (dict(y=[1.0], m=[np.inf], v=[1.0]), "inf"),
    (dict(y=[1.0, 1.0], m=[0.0], v=[1.0]), "equal lengths"),
])
def test_bad_input_raises(bad, match):
    for lik in LIKS:
        with pytest.raises(ValueError, match=match):
            lik.tilted_moments(bad["y"], bad["m"], bad["v"])


def test_cython_entry_checks_lengths_and_status():
    x, w = np.polynomial.hermite_e.hermegauss(8)
    w = w / w.sum()
    with pytest.raises(ValueError, match="equal lengths"):
        core.tilted_moments_vec(0, 0.0, x, w, np.ones(2), np.zeros(3), np.ones(2))
    with pytest.raises(ValueError, match="kind"):
        core.slr_moments_vec(7, 0.0, x, w, np.zeros(1), np.ones(1))
    with pytest.raises(ValueError, match="eps"):
        core.slr_moments_vec(2, 0.7, x, w, np.zeros(1), np.ones(1))
    # cav_var <= 0 is a non-zero status from the kernel (first failing index reported)
    *_, bad = core.tilted_moments_vec(3, 0.0, x, w, np.ones(2), np.zeros(2), np.array([1.0, 0.0]))
    assert bad == 1
    # Heaviside far on the wrong side: Z underflows -> status, not a silent -inf
    *_, bad = core.tilted_moments_vec(3, 0.0, x, w, np.ones(1), np.array([-1e200]), np.ones(1))
    assert bad == 0


def test_params_resolver_and_spec():
    assert get_likelihood("PROBIT") == Probit()
    assert get_likelihood("noisy_threshold") == NoisyThreshold()
    lik = Logit(gh_order=20)
    assert get_likelihood(lik) is lik
    with pytest.raises(ValueError, match="probit, logit, noisy_threshold, heaviside"):
        get_likelihood("tanh")
    nt = NoisyThreshold(eps=0.1)
    assert nt.get_params() == {"eps": 0.1, "gh_order": 48}
    assert nt.set_params(eps=0.2).eps == 0.2 and nt != NoisyThreshold(0.1)
    assert repr(nt) == "NoisyThreshold(eps=0.2, gh_order=48)"
    assert pickle.loads(pickle.dumps(nt)) == nt
    with pytest.raises(ValueError, match="invalid parameter"):
        nt.set_params(foo=1)
    kind, eps, x, w, _ = nt.compiled_spec()
    assert (kind, eps, len(x)) == (2, 0.2, 48) and abs(w.sum() - 1) < 1e-14
    assert [lk.compiled_spec()[0] for lk in LIKS] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="eps"):
        NoisyThreshold(0.5).slr_moments([0.0], [1.0])
    with pytest.raises(ValueError, match="gh_order"):
        Logit(gh_order=0).slr_moments([0.0], [1.0])
    assert Probit().log_concave and not NoisyThreshold().log_concave
    assert not Heaviside().differentiable and Logit().differentiable


def test_sklearn_clone():
    from sklearn.base import clone
    nt = NoisyThreshold(eps=0.03, gh_order=20)
    c = clone(nt)
    assert c == nt and c is not nt


# -- logit far from the transition (v > 1, |y m| >> v/2) ------------------------------------------
# The split sigma = H + d integrates d by Gauss-Laguerre, which cannot resolve a narrow Gaussian far
# from t = 0; there the kernels use sigma(t) N(t|a,v) = e^(a+v/2) sigma(-t) N(t|a+v,v) and its
# complement (docs/derivations.md).  Seen before that: the tilted variance 12 % off at y m = -40,
# v = 1.01, a negative EP site precision from a log-concave likelihood at y m = -20, and NaN means
# in PL Table I fits on breast cancer.  The reference integrates in log space around the maximum of
# the integrand, so Z ~ e^-370 and site precisions ~ 1e-160 are resolved.

FAR_A = [-400.0, -371.3, -100.0, -40.0, -20.0, -10.0, 10.0, 20.0, 40.0, 100.0, 400.0]
FAR_V = [1.01, 1.5, 4.88, 30.0, 100.0]


def log_expect(log_h, a, v):
    """log E[h(t)] for t ~ N(a, v) and h > 0, by quad of exp(log h - (t-a)^2/2v - max) near the max."""
    phi = lambda t: log_h(t) - 0.5 * (t - a) ** 2 / v
    t0 = a
    for _ in range(100):   # phi is concave for the h used here; Newton with numerical derivatives
        h = 1e-4 * max(1.0, np.sqrt(v))
        g = (phi(t0 + h) - phi(t0 - h)) / (2 * h)
        c = (phi(t0 + h) - 2 * phi(t0) + phi(t0 - h)) / h ** 2
        step = g / c
        t0 = t0 - step if c < 0 else t0 + np.sign(g) * h
        if abs(step) < 1e-10 * (1 + abs(t0)):
            break
    width = 1.0 / np.sqrt(max(-c, 1e-12))
    lo, hi = t0 - 40 * width, t0 + 40 * width
    top = phi(t0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        val = integrate.quad(lambda t: np.exp(phi(t) - top), lo, hi, points=[0.0] if lo < 0 < hi else None,
                             limit=800, epsabs=0, epsrel=1e-13)[0]
    return top + np.log(val) - 0.5 * np.log(2 * np.pi * v)


log_sig = lambda t: -np.logaddexp(0.0, -t)


def test_logit_tilted_moments_far_from_the_transition():
    # Z, E[t], Var[t] of sigma(t) N(t|a,v) and the EP site precision 1/Var - 1/v.  Moments of the
    # tilted density: E[t] - a = v E_p[sigma(-t)] (Stein), v - Var = v^2 (E_p[sigma sigma(-)] -
    # Var_p[sigma(-t)]) with the last term from E_p[sigma(-t)^2]; every expectation is a log_expect.
    # Tolerances: 1e-9 on log Z (relative to max(1, |log Z|)), mean and variance; 1e-6 on the site
    # precision where it is resolvable in double (v - Var > 1e-9 v; below that 1/Var - 1/v is
    # rounding), which the kernels meet with ~1e-8 (measured).
    lik = Logit()
    for v in FAR_V:
        for a in FAR_A:
            lz, mu, var = (x[0] for x in lik.tilted_moments([1.0], [a], [v]))
            ref_lz = log_expect(log_sig, a, v)
            e_neg = np.exp(log_expect(lambda t: log_sig(t) + log_sig(-t), a, v) - ref_lz)   # E_p[σ(-t)]
            e_pp = np.exp(log_expect(lambda t: 2 * log_sig(t) + log_sig(-t), a, v) - ref_lz)  # E_p[σσ(-)]
            e_nn = np.exp(log_expect(lambda t: log_sig(t) + 2 * log_sig(-t), a, v) - ref_lz)  # E_p[σ(-)²]
            ref_mean = a + v * e_neg
            delta = v * v * (e_pp - (e_nn - e_neg ** 2))
            assert abs(lz - ref_lz) < 1e-9 * max(1.0, abs(ref_lz)), (a, v, lz, ref_lz)
            assert abs(mu - ref_mean) < 1e-9 * max(1.0, abs(ref_mean)), (a, v, mu, ref_mean)
            assert abs(var - (v - delta)) < 1e-9 * v, (a, v, var, v - delta)
            if delta > 1e-9 * v:
                tau, ref_tau = 1 / var - 1 / v, delta / (v * (v - delta))
                assert abs(tau - ref_tau) < 1e-6 * ref_tau, (a, v, tau, ref_tau)


def test_logit_slr_predictive_and_expected_log_prob_far_from_the_transition():
    # PL's P = E[sigma(f)], 1 - P and Cov[f, tanh(f/2)] = 2 v E[sigma sigma(-)] (Stein) to 1e-9
    # relative, each resolved also where it is ~e^-370 (PL's site precision A^2/Omega is built from
    # them); the expected log-likelihood to 1e-9 absolute (a bound sums these), its derivatives
    # y E[sigma(-t)] and -E[sigma sigma(-)]/2 to 1e-9 relative.
    lik = Logit()
    m = np.array([a for v in FAR_V for a in FAR_A])
    v = np.array([v for v in FAR_V for a in FAR_A])
    mu_y, cov, var_y = lik.slr_moments(m, v)
    p = lik.predictive_probability(m, v)
    e, de_dm, de_dv = lik.expected_log_prob(np.ones_like(m), m, v)
    for i, (mi, vi) in enumerate(zip(m, v)):
        lp = log_expect(log_sig, mi, vi)
        lq = log_expect(lambda t: log_sig(-t), mi, vi)
        lc = log_expect(lambda t: log_sig(t) + log_sig(-t), mi, vi)
        P, Q = np.exp(lp), np.exp(lq)
        np.testing.assert_allclose([p[i], var_y[i], cov[i], de_dm[i], -2 * de_dv[i]],
                                   [P, 4 * P * Q, 2 * vi * np.exp(lc), Q, np.exp(lc)], rtol=1e-9)
        assert abs(mu_y[i] - (P - Q)) < 1e-9 * max(P, Q)
        sd = np.sqrt(vi)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref_e = integrate.quad(lambda t: log_sig(t) * np.exp(-0.5 * (t - mi) ** 2 / vi) / np.sqrt(2 * np.pi * vi),
                                   mi - 40 * sd, mi + 40 * sd, points=[0.0] if abs(mi) < 40 * sd else None,
                                   limit=800, epsabs=1e-14, epsrel=1e-13)[0]
        assert abs(e[i] - ref_e) < 1e-9 * max(1.0, abs(ref_e)), (mi, vi, e[i], ref_e)


def test_logit_pl_sites_far_out_are_accurate_and_bounded():
    # PL's site from SLR: A = cov/v, Omega = Var[y] - A^2 v, tau = A^2/Omega (as _sites builds it).
    # Omega >= E[C(y|f)] = 4 E[sigma sigma(-)] = 2 cov/v, so tau <= cov/(2v) <= 1/8 exactly.  Means as
    # far out as undamped parallel PL sends them (|m| = 4550 was seen on breast cancer): cov by
    # Stein to 1e-9 relative where representable (GH of a smooth positive integrand), tau finite
    # and within the bound; before, cov cancelled to ~1e-17 and tau reached 1e266.
    lik = Logit()
    m = np.array([mi for vi in (0.01, 0.3, 1.0, 4.88) for mi in (-4550.0, -700.0, -100.0, -40.0, 40.0, 700.0)])
    v = np.array([vi for vi in (0.01, 0.3, 1.0, 4.88) for mi in range(6)])
    mu_y, cov, var_y = lik.slr_moments(m, v)
    A = cov / v
    omega = np.maximum(var_y - A * A * v, 1e-300)
    tau = A * A / omega
    assert np.all(np.isfinite(tau)) and np.all(tau >= 0) and np.all(tau <= 0.125 * (1 + 1e-12))
    for i, (mi, vi) in enumerate(zip(m, v)):
        ref = 2 * vi * np.exp(log_expect(lambda t: log_sig(t) + log_sig(-t), mi, vi))
        if ref > 1e-300:
            assert abs(cov[i] - ref) < 1e-9 * ref, (mi, vi, cov[i], ref)
