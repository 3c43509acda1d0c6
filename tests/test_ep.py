"""Expectation propagation: the claims of R&W §3.6 / Alg. 3.5, 5.2, NR eq. (11)-(13) and the PL paper."""

import numpy as np
import pytest
from scipy import stats

from gpc import NegativeVarianceError
from gpc.datasets import load_breast_cancer_wisconsin_original
from gpc.inference import infer
from gpc.inference import _sites
from gpc.inference._sites import NegativeSitesWarning, ParallelMarginals
from gpc.likelihoods import Logit, NoisyThreshold, Probit
from gpc.posterior import SitePosterior
from helpers import rbf, toy
from reference_ep_pl import ep_reference

# runs with tol=1e-300 make a fixed number of sweeps on purpose; their ConvergenceWarning is expected
pytestmark = pytest.mark.filterwarnings("ignore:.*tol 1e-300:gpc.exceptions.ConvergenceWarning")


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer_wisconsin_original(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    y = np.where(y == np.unique(y)[1], 1.0, -1.0)
    return rbf(X[:250], 3.0, 4.0), y[:250]


@pytest.mark.parametrize("n", [3, 4, 5, 6, 8])
def test_probit_evidence_close_to_exact(n):
    # For probit, Z = P(all y_i (f_i + e_i) > 0) = orthant probability of N(0, D(K + I)D), D = diag(y).
    # scipy's multivariate_normal.cdf (Genz) is accurate to ~1e-6 here; EP must be within 0.03.
    X, y = toy(n, n)
    K = rbf(X, 1.0, 2.0)
    D = np.diag(y)
    exact = np.log(stats.multivariate_normal(np.zeros(n), D @ (K + np.eye(n)) @ D).cdf(np.zeros(n)))
    r = infer(K, y, likelihood="probit", method="ep", tol=1e-10)
    assert abs(r.log_evidence - exact) < 0.03


@pytest.mark.parametrize("lik", [Probit(), Logit()], ids=["probit", "logit"])
@pytest.mark.parametrize("schedule", ["sequential", "parallel"])
def test_matches_slow_reference(lik, schedule):
    # Same updates in the same order, same sweeps: only rounding separates the fast path from the
    # explicit-inverse reference (K well conditioned here): 1e-8.  Two sweeps, before the fixed
    # point, where the schedules still differ by 1e-3 or more (at 6 they agreed to 4e-8).
    X, y = toy(12, 1)
    K = rbf(X, 1.2, 2.0) + 1e-6 * np.eye(12)
    m0 = np.linspace(-0.3, 0.3, 12)
    mu, Sigma, tau, nu, lz = ep_reference(K, y, lik, m0, sweeps=2, parallel=schedule == "parallel")
    r = infer(K, y, likelihood=lik, method="ep", schedule=schedule, prior_mean=m0, max_iter=2,
              tol=1e-300)
    np.testing.assert_allclose(r.site_precision, tau, atol=1e-8)
    np.testing.assert_allclose(r.site_location, nu, atol=1e-8)
    np.testing.assert_allclose(r.mean, mu, atol=1e-8)
    np.testing.assert_allclose(r.cov, Sigma, atol=1e-8)
    assert abs(r.log_evidence - lz) < 1e-8


def test_sequential_and_parallel_reach_the_same_fixed_point(cancer):
    K, y = cancer
    a = infer(K, y, likelihood="probit", method="ep", schedule="sequential", tol=1e-10)
    b = infer(K, y, likelihood="probit", method="ep", schedule="parallel", tol=1e-10)
    assert a.converged and b.converged
    assert abs(a.log_evidence - b.log_evidence) < 1e-6
    np.testing.assert_allclose(a.mean, b.mean, atol=1e-5)


def test_blocked_sweep_equals_plain_rank_one_sweep(cancer):
    # the deferred block updates are the same arithmetic regrouped: equal to rounding (1e-10)
    K, y = cancer
    plain = infer(K, y, likelihood="logit", method="ep", max_iter=3, block=1, tol=1e-300)
    for block in (7, 64, 250):
        blocked = infer(K, y, likelihood="logit", method="ep", max_iter=3, block=block, tol=1e-300)
        np.testing.assert_allclose(blocked.site_precision, plain.site_precision, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(blocked.mean, plain.mean, atol=1e-10)


@pytest.mark.parametrize("lik", [Probit(), Logit()], ids=["probit", "logit"])
def test_gradient_matches_finite_differences(lik):
    # EP's evidence is stationary in the sites at the fixed point, so R&W Alg. 5.2's explicit
    # gradient is the total derivative.  Central differences, h = 1e-5 on log θ, EP to tol 1e-12:
    # agreement to 1e-6 relative.
    X, y = toy(40, 2)
    d2 = ((X[:, None] - X[None]) ** 2).sum(-1)

    def K_of(t):
        return np.exp(t[0]) * np.exp(-0.5 * d2 / np.exp(2 * t[1]))

    t0 = np.array([np.log(2.0), np.log(0.9)])
    K = K_of(t0)
    dK = np.stack([K, K * d2 / np.exp(2 * t0[1])], axis=2)
    r = infer(K, y, likelihood=lik, method="ep", tol=1e-12)
    g = r.log_evidence_gradient(lambda M: np.einsum("ij,ijk->k", M, dK))
    h = 1e-5
    fd = [(infer(K_of(t0 + h * e), y, likelihood=lik, method="ep", tol=1e-12).log_evidence
           - infer(K_of(t0 - h * e), y, likelihood=lik, method="ep", tol=1e-12).log_evidence) / (2 * h)
          for e in np.eye(2)]
    np.testing.assert_allclose(g, fd, rtol=1e-6)


def test_online_adf_is_the_first_sequential_sweep(cancer):
    # MF §5 / docs: one ADF pass in natural order = the first sequential EP sweep from zero sites
    K, y = cancer
    online = infer(K, y, likelihood="probit", method="online")
    ep = infer(K, y, likelihood="probit", method="ep", max_iter=1, tol=1e-300)
    np.testing.assert_allclose(online.mean, ep.mean, atol=1e-8)
    np.testing.assert_allclose(online.posterior.site_precision, ep.site_precision, atol=1e-8)


def test_supplement_example_ep_reports_the_negative_cavity():
    # PL supplement: prior mean (−0.5, −3), unit variances, correlation 0.8, noisy threshold ε = 0.01,
    # y = (1, 1).  EP without fixes meets a negative cavity variance.
    K = np.array([[1.0, 0.8], [0.8, 1.0]])
    m0 = np.array([-0.5, -3.0])
    y = np.array([1.0, 1.0])
    for schedule in ("sequential", "parallel"):
        with pytest.raises(NegativeVarianceError) as err:
            infer(K, y, likelihood=NoisyThreshold(0.01), method="ep", schedule=schedule, prior_mean=m0,
                  on_negative="raise")
        # the paper's figure: −117.9, at the first site of the second sweep (sequential) or of the
        # second parallel update
        assert err.value.cavity_variance == pytest.approx(-117.9, abs=0.05) and err.value.index == 0
    with pytest.warns(NegativeSitesWarning):
        r = infer(K, y, likelihood=NoisyThreshold(0.01), method="ep", prior_mean=m0, on_negative="clip",
                  max_iter=20)
    assert np.all(np.isfinite(r.mean)) and np.all(r.site_precision >= 0)


@pytest.mark.parametrize("schedule", ["sequential", "parallel"])
def test_on_negative_pl_reaches_a_fixed_point_on_the_supplement_example(schedule):
    # Plain EP stops with a negative cavity on this example (test above).  With on_negative="pl" the
    # offending site takes PL's SLR update, and EP runs to a fixed point (tol 1e-6 on the sites) near
    # PL's own: the higher mode (PL supplement), where "clip" settles in the lower one (mean −2.1 at
    # the second site).  (The default, "keep", reaches EP's own fixed point with a negative site:
    # tests/test_ep_negative_sites.py.)  1e-3: the SLR site replaces only the sites whose EP update is negative, so
    # the fixed point is close to PL's but not identical (measured 3e-5 apart).
    K = np.array([[1.0, 0.8], [0.8, 1.0]])
    m0 = np.array([-0.5, -3.0])
    y = np.array([1.0, 1.0])
    lik = NoisyThreshold(0.01)
    with pytest.warns(NegativeSitesWarning):
        r = infer(K, y, likelihood=lik, method="ep", schedule=schedule, prior_mean=m0,
                  on_negative="pl")
    assert r.converged and r.info["n_negative_handled"] > 0
    assert np.all(r.site_precision >= 0) and np.isfinite(r.log_evidence)
    pl = infer(K, y, likelihood=lik, method="pl", prior_mean=m0)
    np.testing.assert_allclose(r.mean, pl.mean, atol=1e-3)
    with pytest.warns(NegativeSitesWarning):
        clip = infer(K, y, likelihood=lik, method="ep", schedule=schedule, prior_mean=m0,
                     on_negative="clip")
    assert clip.mean[1] < -2.0


def test_on_negative_pl_converges_on_noisy_threshold_data(cancer):
    # Noisy threshold on breast cancer (200 points, prior variance 10): EP without fixes meets a
    # negative cavity; with on_negative="pl" the sequential schedule converges (40 sweeps measured,
    # 200 allowed) with a finite evidence and every site precision >= 0.
    K, y = cancer
    K, y = K[:200, :200] * 2.5, y[:200]
    lik = NoisyThreshold(0.01)
    with pytest.raises(NegativeVarianceError):
        infer(K, y, likelihood=lik, method="ep", on_negative="raise", max_iter=200)
    with pytest.warns(NegativeSitesWarning):
        r = infer(K, y, likelihood=lik, method="ep", on_negative="pl", max_iter=200)
    assert r.converged and np.all(r.site_precision >= 0) and np.isfinite(r.log_evidence)


@pytest.mark.parametrize("bad", [{"damping": 0.0}, {"damping": 1.5}, {"on_negative": "ignore"},
                                 {"order": "backwards"}, {"order": [0, 0, 1]}, {"schedule": "random"}])
def test_bad_options_are_named(bad):
    K = np.eye(3) + 0.5
    y = np.array([1.0, -1.0, 1.0])
    with pytest.raises(ValueError):
        infer(K, y, likelihood="probit", method="ep", **bad)


def test_random_order_and_damping_reach_the_same_fixed_point(cancer):
    K, y = cancer
    a = infer(K, y, likelihood="probit", method="ep", tol=1e-10)
    b = infer(K, y, likelihood="probit", method="ep", order="random", random_state=3, damping=0.7,
              tol=1e-10)
    assert abs(a.log_evidence - b.log_evidence) < 1e-6


def test_warm_start_from_previous_sites(cancer):
    K, y = cancer
    cold = infer(K, y, likelihood="probit", method="ep", tol=1e-9)
    warm = infer(K * 1.02, y, likelihood="probit", method="ep", tol=1e-9, init=cold)
    again = infer(K * 1.02, y, likelihood="probit", method="ep", tol=1e-9)
    assert abs(warm.log_evidence - again.log_evidence) < 1e-6
    assert warm.n_iter < again.n_iter


def test_negative_sites_without_fixes_are_represented_exactly():
    # In the supplement's example visited in the order (2, 1), EP without fixes keeps a negative site
    # precision and converges; the posterior must still be (K⁻¹ + T)⁻¹ exactly (here via the LU of
    # I + T K), checked against explicit inverses to 1e-10.
    K = np.array([[1.0, 0.8], [0.8, 1.0]])
    m0 = np.array([-0.5, -3.0])
    y = np.array([1.0, 1.0])
    r = infer(K, y, likelihood=NoisyThreshold(0.01), method="ep", prior_mean=m0, order=[1, 0],
              on_negative="raise", tol=1e-10, max_iter=200)
    tau, nu = r.site_precision, r.site_location
    assert np.any(tau < 0)
    Sigma = np.linalg.inv(np.linalg.inv(K) + np.diag(tau))
    np.testing.assert_allclose(r.cov, Sigma, atol=1e-10)
    np.testing.assert_allclose(r.mean, Sigma @ (np.linalg.solve(K, m0) + nu), atol=1e-10)
    assert np.isfinite(r.log_evidence)


# -- the parallel schedule's in-place refactorisation (ParallelMarginals) ---------------------------

@pytest.fixture(scope="module")
def cancer_400():
    # n = 400 ≥ SINGLE_PRECISION_MIN_N, so parallel EP takes its single-precision early sweeps
    X, y = load_breast_cancer_wisconsin_original(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    return rbf(X[:400], 3.0, 4.0), np.where(y[:400] == np.unique(y)[1], 1.0, -1.0)


def random_sites(n, seed, low=1e-2, high=2.0):
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, n), rng.normal(size=n)


def test_parallel_marginals_equal_the_site_posterior(cancer_400):
    # double precision: the same formulas as SitePosterior on a reused buffer; B has eigenvalues
    # in [1, 1 + 2 λmax(K)] (~1e3 here), so rounding differences stay below 1e-11
    K, _ = cancer_400
    tau, nu = random_sites(len(K), 0)
    m0 = np.full(len(K), 0.2)
    ref = SitePosterior(K, tau, nu, m0)
    pm = ParallelMarginals(K, m0)
    mu, var = pm(tau, nu)
    assert not pm.single
    np.testing.assert_allclose(mu, ref.mean, rtol=0, atol=1e-11)
    np.testing.assert_allclose(var, ref.diag_cov(), rtol=1e-11)
    post = pm.posterior()                        # hands its factor over: no refactorisation
    np.testing.assert_allclose(post.L, ref.L, atol=1e-12)
    assert abs(post.log_det_B - ref.log_det_B) < 1e-9
    np.testing.assert_allclose(post.R(), ref.R(), atol=1e-11)   # needs the zero upper triangle


def test_single_precision_marginals_are_within_their_stated_error(cancer_400):
    # float32 factor and inverse: relative error of (1 − [B⁻¹]_ii)/τ_i is ~ u32 cond(B) / (τ_i Σ_ii)
    # with u32 = 6e-8; here τ ≥ 1e-2 and cond(B) ~ 1e3, so 1e-3 relative bounds it with margin, and
    # the mean (a corrected solve) within 1e-4.  This is what the early sweeps may carry.
    K, _ = cancer_400
    tau, nu = random_sites(len(K), 1)
    m0 = np.zeros(len(K))
    ref = SitePosterior(K, tau, nu, m0)
    pm = ParallelMarginals(K, m0)
    mu, var = pm(tau, nu, single=True)
    assert pm.single
    np.testing.assert_allclose(var, ref.diag_cov(), rtol=1e-3)
    np.testing.assert_allclose(mu, ref.mean, rtol=0, atol=1e-4)
    with pytest.raises(RuntimeError, match="single precision"):
        pm.posterior()


@pytest.mark.parametrize("single", [False, True])
def test_tiny_site_precisions_take_the_exact_column(cancer_400, single):
    # sites with τ below TINY_TAU (1e-6 double, 1e-3 single) get Σ_ii = K_ii − ‖L⁻¹ S K e_i‖²; the
    # plain formula would divide a rounding error of ~u by τ_i (1e-16/1e-9 = 1e-7 in double, 6e-8/1e-9
    # = 60 in single).  The column cancels K_ii against ‖·‖² (K_ii/Σ_ii ~ 100 here), so in single
    # precision it holds to the 1e-3 of the other single-precision marginals, in double to 1e-12.
    K, _ = cancer_400
    tau, nu = random_sites(len(K), 2)
    tau[::7] = 1e-9
    ref = SitePosterior(K, tau, nu, np.zeros(len(K)))
    pm = ParallelMarginals(K, np.zeros(len(K)))
    _, var = pm(tau, nu, single=single)
    np.testing.assert_allclose(var[::7], ref.diag_cov()[::7], rtol=1e-3 if single else 1e-12)


def test_single_precision_falls_back_to_double_when_B_does_not_factor():
    # τ = 1e8 on a nearly constant K: B = I + S K S has condition ~1e11, beyond float32 (spotrf
    # fails) but within float64; the marginals must then come from the double factor
    X, _ = toy(300, 3)
    K = rbf(X, 50.0, 1.0) + 1e-6 * np.eye(300)
    tau, nu = np.full(300, 1e8), np.linspace(-1, 1, 300)
    ref = SitePosterior(K, tau, nu, np.zeros(300))
    pm = ParallelMarginals(K, np.zeros(300))
    _, var = pm(tau, nu, single=True)
    assert not pm.single
    np.testing.assert_allclose(var, ref.diag_cov(), rtol=1e-8)


@pytest.mark.parametrize("lik", ["probit", "logit"])
def test_single_precision_sweeps_do_not_move_the_fixed_point(cancer_400, lik, monkeypatch):
    # mixed precision (float32 while sites move by > 1e-2) against all-double parallel EP: both stop
    # when no site moves by more than tol = 1e-8 relative, so they agree to ~1e-7 in every output
    K, y = cancer_400
    calls = []
    original = ParallelMarginals.__call__

    def counting(self, tau, nu, single=False):
        out = original(self, tau, nu, single)
        calls.append(self.single)
        return out

    monkeypatch.setattr(ParallelMarginals, "__call__", counting)
    mixed = infer(K, y, likelihood=lik, method="ep", schedule="parallel", tol=1e-8)
    assert any(calls) and not calls[-1]          # float32 early, double at the end
    calls.clear()
    monkeypatch.setattr(_sites, "SINGLE_PRECISION_ABOVE", np.inf)
    double = infer(K, y, likelihood=lik, method="ep", schedule="parallel", tol=1e-8)
    assert not any(calls)
    assert mixed.converged and double.converged
    assert abs(mixed.log_evidence - double.log_evidence) < 1e-6
    np.testing.assert_allclose(mixed.mean, double.mean, atol=1e-6)
    np.testing.assert_allclose(mixed.site_precision, double.site_precision, rtol=1e-6, atol=1e-9)


def test_single_precision_rule():
    # float32 above 1e-2; below, only after a float32 sweep that shrank the change by half, and
    # never below the floor of the float32 marginals' rounding; small problems stay double
    rule = _sites.single_precision
    assert rule(400, 0.5, np.inf, False)
    assert rule(400, 5e-3, 2e-2, True)                  # still contracting in single precision
    assert not rule(400, 5e-3, 8e-3, True)              # stalled: hand over to double
    assert not rule(400, 5e-3, 2e-2, False)             # once double, double
    assert not rule(400, 5e-5, 1e-3, True)              # below the floor
    assert not rule(100, 0.5, np.inf, False)            # n < SINGLE_PRECISION_MIN_N


def test_single_precision_sweeps_follow_the_rule(cancer_400, monkeypatch):
    # on a probit problem (no restarts, so no sweep moves the sites by > 1e-2 again once they
    # settle) the schedule runs float32 sweeps first, then double ones to the end
    K, y = cancer_400
    asked = []
    original = _sites.single_precision

    def recording(*args):
        asked.append(original(*args))
        return asked[-1]

    monkeypatch.setattr(_sites, "single_precision", recording)
    result = infer(K, y, likelihood="probit", method="ep", schedule="parallel", tol=1e-8)
    assert result.converged and asked[0] and not asked[-1]
    first_double = asked.index(False)
    assert not any(asked[first_double:])                # no return to float32
