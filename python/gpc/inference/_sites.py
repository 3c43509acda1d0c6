"""The Gaussian-site engine shared by EP and PL: one site rule, two schedules.

The site rule (EP's moment matching, PL's statistical linear regression, damping and the policy for
negative variances) is one `nogil` Cython function, ``site_update`` in gpc._site_rule; both schedules
call it:

- ``sequential``: sites visited one at a time; after each, the posterior N(μ, Σ) takes a rank-one
  update (in Cython, deferred in blocks and applied as rank-b BLAS-3 updates, gpc._sweeps).  Σ is
  recomputed from the sites every ``RECOMPUTE_EVERY`` sweeps to stop rounding drift.
- ``parallel``: every site is updated against one posterior, which is then refactored once
  (``ParallelMarginals``: in place, in one reused buffer).  While the sites still move by more than
  ``SINGLE_PRECISION_ABOVE`` in a sweep, and below that while single-precision sweeps keep shrinking
  the change (``single_precision``), that refactorisation is made in single precision (half the
  cost of dpotrf + dtrtri); its error (~1e-4 relative in the marginal variances) is below the change
  of those sweeps, and every later sweep, and so the fixed point and the result, is double
  precision.

EP produces negative site variances by its nature for non-log-concave likelihoods (the noisy
threshold, PL supplement): the tilted distribution can be wider than the cavity.  That is no fault:
the posterior q(f) ∝ N(f|m0, K) Π t̃_i stays a distribution while Σ = (K⁻¹ + T)⁻¹ is positive
definite, and every site has its cavity while each τ_c,i = 1/Σ_ii − τ̃_i > 0.  What EP cannot do is
update a site without a cavity, and a sequential rank-one update must keep 1 + Δτ Σ_ii > 0.  The
policy ``on_negative`` decides (codes of gpc._site_rule; the default is
``gpc.inference.ep.DEFAULT_ON_NEGATIVE``):

- "keep" (default): negative site precisions are kept, so the fixed point is EP's own.  A site
  without a cavity falls back to PL's statistical-linear-regression update against its marginal
  (PL eq. (15)-(16)): a fitted Gaussian site of its likelihood term, defined without a cavity, where
  that keeps the site's marginal precision τ_c + τ̃ positive; otherwise, and where a sequential
  rank-one update would make Σ indefinite, the site keeps its old value for that sweep.  The parallel
  schedule's fallback for a posterior it cannot form is its adaptive damping (gpc.inference._damping).
- "keep-skip": as "keep", but a site without a cavity always keeps its old value.  (A "clip" fallback
  would be the same: without a cavity there is no matched site to clip.)  Where the old site is what
  makes the cavity negative, the sweep can settle with that site stuck, which is no EP fixed point
  (the PL supplement's example); "keep"'s PL site moves it.
- "raise": EP without fixes: negative sites kept, and a site without a cavity stops the run with
  NegativeVarianceError(index, cavity_variance).
- "clip": every negative site precision becomes 1e-8 (``CLIP_PRECISION`` of gpc._site_rule; its site
  mean kept), as GPML and the PL paper's experiments (§IV) do; a site without a cavity keeps its old
  value.  This moves the fixed point (the paper's Table I runs use it: experiments/pl_table1.py).
- "skip": every update that would be negative keeps the old site.
- "pl": every update that would be negative (and every site without a cavity) takes PL's SLR update
  instead, which is never negative (PL §III-D).
Negative sites are held by SignedSitePosterior (the Cholesky of B for a non-negative split of the
sites and a Woodbury correction of rank #negative sites, which checks that Σ is positive definite);
with "clip", "skip" and "pl" every τ ≥ 0 and the posterior is the Cholesky of B = I + S K S.  A warm
start whose sites (another kernel's) give no posterior with this K starts cold instead; sites of
the run itself that give none (the rounding of the sequential updates on a nearly singular K, or a
parallel update) raise DivergenceError with the remedies that apply to the schedule in use.

Each sweep counts the updates the policy handled; the count of the final sweep is the result's
``info["n_fallback"]`` (EP).  With it zero and the run converged, every site equals its own EP
update to ``tol``: the result is an EP fixed point (``info["ep_fixed_point"]``), whatever fallbacks
earlier sweeps needed.
"""

import warnings

import numpy as np

from .. import _dense, _lapack, _site_rule, _sweeps
from .._site_rule import SITE_LIKELIHOOD_FAILED, SITE_NEGATIVE_CAVITY, SITE_UPDATED
from .._sweeps import SWEEP_INDEFINITE
from ..exceptions import (ConvergenceWarning, DivergenceError, NegativeVarianceError,
                          NotPositiveDefiniteError)
from .._parallel import over_rows
from ..posterior import TINY_SITE_PRECISION, InverseFactorPosterior, site_posterior
from ._damping import AT_ROUNDING_FLOOR, AdaptiveDamping, rounding_level
from .rules import ON_NEGATIVE, RULES

RECOMPUTE_EVERY = 5
DEFAULT_BLOCK = 64
#: parallel sweeps whose sites moved by more than this refactor in single precision
SINGLE_PRECISION_ABOVE = 1e-2
#: ... and so do later ones, down to this change, while each sweep still shrinks the change of the
#: one before by SINGLE_PRECISION_CONTRACTION: single precision gives marginals to ~1e-4 (the
#: iteration stalls near there if B is ill-conditioned, and the stall hands over to double)
SINGLE_PRECISION_FLOOR = 1e-4
SINGLE_PRECISION_CONTRACTION = 0.5
#: ... when n is at least this (below it the factorisation is cheap and double precision is kept)
SINGLE_PRECISION_MIN_N = 256


class NegativeSitesWarning(RuntimeWarning):
    """EP's final sweep needed the on_negative policy (a cavity that is not a distribution, or a
    negative site that "clip", "skip" or "pl" replaced): the result is not an EP fixed point."""


def check_options(damping, on_negative, schedule):
    if not (isinstance(damping, (int, float)) and 0.0 < damping <= 1.0):
        raise ValueError(f"damping must be a number in (0, 1], got {damping!r}")
    if on_negative not in ON_NEGATIVE:
        raise ValueError(f"on_negative must be one of {', '.join(ON_NEGATIVE)}, got {on_negative!r}")
    if schedule not in ("sequential", "parallel"):
        raise ValueError(f"schedule must be 'sequential' or 'parallel', got {schedule!r}")


def visiting_order(n, order, random_state):
    """None: natural order; "random": a fresh permutation per sweep; or a given permutation."""
    if order is None:
        return lambda sweep: np.arange(n, dtype=np.intp)
    if isinstance(order, str):
        if order != "random":
            raise ValueError(f"order must be None, 'random' or a permutation, got {order!r}")
        rng = random_state if isinstance(random_state, np.random.Generator) else np.random.default_rng(random_state)
        return lambda sweep: rng.permutation(n).astype(np.intp)
    perm = np.asarray(order)
    if perm.shape != (n,) or not np.array_equal(np.sort(perm), np.arange(n)):
        raise ValueError("order must be a permutation of range(n)")
    perm = perm.astype(np.intp)
    return lambda sweep: perm


def initial_sites(n, init, method):
    """Zero sites, or the sites of a previous result of the same method (warm start)."""
    if init is not None and init.method == method and init.site_precision.shape == (n,):
        return init.site_precision.copy(), init.site_location.copy()
    return np.zeros(n), np.zeros(n)


def _moments(K, tau, nu, m0):
    if not np.any(tau) and not np.any(nu):      # the prior itself: no factorisation needed
        return None, m0.copy(), np.diag(K).copy()
    post = site_posterior(K, tau, nu, m0)
    return post, post.mean.copy(), post.diag_cov().copy()


def _first_state(state, K, tau, nu, m0):
    """``state(K, τ, ν, m0)`` of the starting sites, and the sites.  Sites of a warm start (another
    K's, negative precisions among them) that give no posterior with this K are dropped for zero
    sites (the prior, which always is one): the run starts cold, as it would without them."""
    try:
        return state(K, tau, nu, m0), tau, nu
    except NotPositiveDefiniteError:
        if not np.any(tau < 0):
            raise                       # τ ≥ 0 always gives a posterior: K itself is the problem
        tau, nu = np.zeros_like(tau), np.zeros_like(nu)
        return state(K, tau, nu, m0), tau, nu


def _site_posterior(K, tau, nu, m0, rule, schedule, on_negative, sweep):
    """site_posterior, with the DivergenceError of gpc.exceptions' policy where negative site
    precisions leave no posterior: it names the sweep and what can be done for ``schedule``."""
    try:
        return site_posterior(K, tau, nu, m0)
    except NotPositiveDefiniteError as err:
        if not np.any(tau < 0):
            raise
        raise DivergenceError(_indefinite_message(rule, schedule, on_negative, sweep, tau),
                              method=rule) from err


def _indefinite_message(rule, schedule, on_negative, sweep, tau):
    """What a run whose sites (``tau``, some negative) give no posterior after ``sweep`` says: the
    cause, and what can be done under ``schedule`` (:func:`negative_site_remedies`)."""
    neg = int(np.count_nonzero(tau < 0))
    if schedule == "sequential":
        cause = ("the rank-one updates keep Σ positive definite in exact arithmetic, but not their "
                 "rounding on a nearly singular K")
    else:
        cause = "a parallel update of all sites at once can take Σ past positive definiteness"
    return (f"{rule.upper()} ({schedule}): after sweep {sweep} the {neg} negative site precisions "
            f"kept by on_negative={on_negative!r} make the posterior covariance Σ = (K⁻¹ + T)⁻¹ "
            f"indefinite, so the sites define no distribution ({cause}).  "
            + negative_site_remedies(schedule, on_negative))


def negative_site_remedies(schedule, on_negative):
    """The advice of a run that negative sites left without a posterior or without cavities: what
    applies to ``schedule`` and ``on_negative``, never what is already in use."""
    options = []
    if schedule == "parallel":
        options.append("schedule='sequential' (one site at a time, each update checked)")
    if on_negative != "pl":
        options.append("on_negative='pl' (PL's site for every update that would be negative: every "
                       "site precision ≥ 0, so the posterior and every cavity exist; it moves the "
                       "fixed point, as 'clip' and 'skip' do more)")
    options.append("method='pl'")
    options.append("a kernel kept from making K nearly singular (a fixed kernel, or a lower upper "
                   "bound on its length scale; optimizer=None in the estimators)")
    return "Try " + ", ".join(options[:-1]) + " or " + options[-1] + "."


def _sweep_state(K, tau, nu, m0):
    """(μ, Σ) from the sites for the sequential sweep, Σ held in its lower triangle (C order)."""
    if not np.any(tau) and not np.any(nu):
        return m0.copy(), K.copy()
    post = site_posterior(K, tau, nu, m0)
    return post.mean.copy(), post.lower_cov(release_factor=True)   # peak K, V, Σ


class ParallelMarginals:
    """Marginals μ, diag Σ of the site posterior for the parallel schedule, refactored in place.

    Per call: B = I + S K S is written into one reused buffer (gpc._dense.fill_b), factored there
    (potrf), α = b − S B⁻¹ S K b with b = ν − T m0 and μ = m0 + K α (R&W eq. (3.67)), and the factor
    is inverted in place (trtri) for diag Σ = (1 − diag B⁻¹)/τ, diag B⁻¹ being the column sums of
    (L⁻¹)².  Sites with small τ take the exact column Σ_ii = K_ii − ‖L⁻¹ S K e_i‖² instead, since the
    rounding error of 1 − [B⁻¹]_ii is divided by τ_i.  ``single=True`` does all of this in float32
    (except the products with K) in a float32 buffer; :meth:`posterior` then refuses, so the result
    always comes from a double factor, and it is an InverseFactorPosterior holding L⁻¹.
    """

    #: below these τ the exact column is used (the error of (1 − [B⁻¹]_ii)/τ_i is ~u/τ_i; float32's
    #: unit roundoff is 6e-8, so its threshold is larger by the ratio of the roundoffs, ~1e3)
    TINY_TAU = {np.float64: TINY_SITE_PRECISION, np.float32: 1e-3}

    def __init__(self, K, m0):
        n = K.shape[0]
        self.K, self.m0, self.n = K, m0, n
        self._buffers = {}
        self.single = False

    def _buffer(self, dtype):
        key = np.dtype(dtype).name
        if key not in self._buffers:
            self._buffers[key] = np.empty((self.n, self.n), dtype=dtype)
        return self._buffers[key]

    def __call__(self, tau, nu, single=False):
        """(μ, diag Σ) for sites (τ ≥ 0, ν); falls back to double if float32 cannot factor B."""
        if single and self._marginals(tau, nu, np.float32):
            self.single = True
            return self.mu, self.var
        self.single = False
        # the single-precision buffer is not needed again (the schedule does not go back to
        # float32 once its sites have settled): half an n x n buffer less at the peak
        self._buffers.pop("float32", None)
        if not self._marginals(tau, nu, np.float64):
            raise NotPositiveDefiniteError("B = I + S K S is not positive definite: K is not a "
                                           "covariance matrix, or the site precisions overflow")
        return self.mu, self.var

    def _marginals(self, tau, nu, dtype):
        # Every BLAS/LAPACK call here goes through gpc._lapack (scipy's BLAS) and the element passes
        # of gpc._dense through gpc._parallel's sleeping threads: with NumPy's BLAS (K @ v) or OpenMP
        # loops in between, the other library's idle threads keep spinning on the core that the
        # Cholesky's second thread needs, and two threads are slower than one.
        K, m0, n = self.K, self.m0, self.n
        s = np.sqrt(tau)
        L = self._buffer(dtype)
        over_rows(_dense.fill_b, n, K, s, L)
        info = _lapack.cholesky_in_place(L)      # C-order lower triangle = Fortran 'upper'
        if info != 0:
            return False
        b = nu - tau * m0
        Kv = np.empty(n)
        _lapack.matvec(K, b, Kv)
        x = (s * Kv).astype(dtype)
        _lapack.cholesky_solve_in_place(L, x)    # B⁻¹ S K b
        self.alpha = b - s * x
        _lapack.matvec(K, self.alpha, Kv)
        self.mu = m0 + Kv
        Linv = L                                 # in place: no copy of the factor is kept
        info = _lapack.triangular_inverse_in_place(Linv)
        if info != 0:  # pragma: no cover - a Cholesky factor has a positive diagonal
            return False
        diag_B_inv = np.empty(n)
        over_rows(_dense.column_sq_sums_lower, n, Linv, diag_B_inv, cost="upper")
        var = np.empty(n)
        ok = tau > self.TINY_TAU[dtype]
        var[ok] = (1.0 - diag_B_inv[ok]) / tau[ok]
        idx = np.flatnonzero(~ok)
        if idx.size:
            V = (K[idx] * s[None, :]).astype(dtype)          # rows: S K e_i (K symmetric)
            _lapack.multiply_triangular_rows(Linv, V, False)  # rows: L⁻¹ S K e_i
            var[idx] = K[idx, idx] - np.einsum("ij,ij->i", V, V, dtype=np.float64)
        self.var = var
        self.tau, self.nu = tau, nu
        return True

    def posterior(self):
        """The posterior of the last (double-precision) call, handing over its inverse factor."""
        if self.single:
            raise RuntimeError("the last parallel refactorisation was single precision")
        Linv = self._buffers.pop("float64")
        return InverseFactorPosterior.from_inverse_factor(self.K, self.tau, self.nu, self.m0, Linv,
                                                          self.alpha, self.mu, self.var)


def run_schedule(K, y, likelihood, m0, *, rule, schedule, max_iter, tol, damping, on_negative,
                 order, random_state, block, init, converged_by, min_damping=None):
    """Iterate the site rule to a fixed point.

    ``converged_by`` is "sites" (EP: largest change of τ, ν relative to 1 + |value|) or "moments"
    (PL: largest change of the posterior means and variances); a sweep converges when that change
    divided by the damping (the residual of the undamped update) is below ``tol``.  The parallel
    schedule halves its damping when the updates oscillate or fail, down to ``min_damping`` (None:
    the damping stays fixed; gpc.inference._damping).  Returns
    (posterior, tau, nu, n_iter, converged, n_fixed, n_fallback, info): the updates the on_negative
    policy handled over the run and in its final sweep, and the damping record.
    """
    n = K.shape[0]
    tau, nu = initial_sites(n, init, rule)
    spec = likelihood.compiled_spec()
    code_rule, code_neg = RULES[rule], ON_NEGATIVE[on_negative]
    next_order = visiting_order(n, order, random_state)
    marginals = ParallelMarginals(K, m0) if schedule == "parallel" else None
    adapt = AdaptiveDamping(damping, min_damping if schedule == "parallel" else None, rule)
    change = last_change = np.inf
    n_fixed = last_fixed = 0

    def update(t, v):
        """The undamped update F at the sites (t, v) from a fresh factorisation (for the probe)."""
        _, m, w = _moments(K, t, v, m0)
        t, v = t.copy(), v.copy()
        status = _site_rule.parallel_update(*spec, code_rule, code_neg, 1.0, y, m, w, t, v)[0]
        return (t, v) if status == SITE_UPDATED else (np.full(n, np.inf), np.full(n, np.inf))

    def probe(t, v):
        """The rounding level of the parallel update at (t, v) (gpc.inference._damping); 0 where the
        update cannot be evaluated, so that nothing passes for rounding there."""
        try:
            level = rounding_level(update, t, v)
        except (NotPositiveDefiniteError, np.linalg.LinAlgError, ArithmeticError):
            return 0.0
        return level if np.isfinite(level) else 0.0

    converged = False
    n_iter = 0
    if schedule == "sequential":
        block = min(DEFAULT_BLOCK if block is None else int(block), n)
        if block < 1:
            raise ValueError("block must be a positive integer")
        # the sweep keeps Σ itself, not a factor
        (mu, Sigma), tau, nu = _first_state(_sweep_state, K, tau, nu, m0)
        var = np.diag(Sigma).copy()
        post = None
        work = np.empty((2 * block + 3, n))
    else:
        (post, mu, var), tau, nu = _first_state(_moments, K, tau, nu, m0)
    for n_iter in range(1, max_iter + 1):
        tau_old, nu_old, mu_old, var_old = tau.copy(), nu.copy(), mu.copy(), var.copy()
        if schedule == "sequential":
            status, index, value, fixed = _sweeps.sequential_sweep(
                Sigma, mu, tau, nu, y, next_order(n_iter), code_rule, *spec, float(damping), code_neg,
                block, work)
            _raise_for(status, index, value, likelihood, rule)
            n_fixed += fixed
            last_fixed = fixed
            var = np.diag(Sigma).copy()
            if n_iter % RECOMPUTE_EVERY == 0:
                Sigma = None            # freed before the refactorisation: peak K, L, V, Σ
                post = _site_posterior(K, tau, nu, m0, rule, schedule, on_negative, n_iter)
                mu, Sigma = post.mean.copy(), post.lower_cov(release_factor=True)
                post = None
                var = np.diag(Sigma).copy()
        else:
            new_tau, new_nu = tau.copy(), nu.copy()
            status, index, value, fixed = _site_rule.parallel_update(
                *spec, code_rule, code_neg, float(adapt.damping), y, mu, var, new_tau, new_nu)
            last_fixed = fixed
            if status == SITE_NEGATIVE_CAVITY:
                _raise_for(status, index, value, likelihood, rule)
            site_change = _site_change(new_tau, new_nu, tau, nu)
            if status == SITE_LIKELIHOOD_FAILED or not np.isfinite(site_change):
                failed = status == SITE_LIKELIHOOD_FAILED
                adapt.failed(n_iter, f"the {likelihood.name} likelihood could not be evaluated at site "
                             f"{index}" if failed else "a site parameter overflowed")
                continue                # the old sites and their posterior stand; retry, damped
            if converged_by == "sites" and site_change < tol * adapt.damping and post is not None:
                # one more update would move no site by more than tol: keep the sites whose
                # posterior is already factored (saves the last refactorisation)
                converged = True
                break
            single = single_precision(n, site_change, last_change, marginals.single)
            last_change = site_change
            moments = _parallel_moments(K, m0, marginals, new_tau, new_nu, single)
            if moments is None:
                adapt.failed(n_iter, "the updated sites give no posterior (B not positive definite "
                             "or a non-finite marginal)")
                if post is marginals:   # its factor buffer was overwritten: refactor the old sites
                    marginals(tau, nu)
                continue
            post, mu, var = moments
            n_fixed += fixed
            restart = adapt.observe(n_iter, tau, nu, new_tau, new_nu, probe=probe)
            if restart is AT_ROUNDING_FLOOR:
                # the steps are the rounding of the update: tol is below what float64 resolves here
                tau, nu = new_tau, new_nu
                converged = True
                break
            tau, nu = (new_tau, new_nu) if restart is None else restart
            if restart is not None:     # back to the sites of the smallest residual, refactored
                post, mu, var = _parallel_moments(K, m0, marginals, tau, nu, single=False)
                continue                # (no convergence test: this sweep made no step)
        if converged_by == "sites":
            change = _site_change(tau, nu, tau_old, nu_old)
        else:
            change = max(np.max(np.abs(mu - mu_old)), np.max(np.abs(var - var_old) / (1e-12 + var)))
        if change < tol * (1.0 if schedule == "sequential" else adapt.damping):
            converged = True
            break
    from_marginals = marginals is not None and post is marginals
    if from_marginals and not marginals.single:
        post = marginals.posterior()
    elif schedule == "sequential" or post is None or from_marginals:
        Sigma = post = None             # freed before the final factorisation
        # the final posterior from the sites (not from the updates), also when every site is empty
        # or when the run stopped after a single-precision sweep
        post = _site_posterior(K, tau, nu, m0, rule, schedule, on_negative, n_iter)
    if not converged:
        warnings.warn(f"{rule.upper()} ({schedule}) did not converge in {max_iter} sweeps (last change "
                      f"{change:.3g} > tol {tol:g})", ConvergenceWarning, stacklevel=4)
    if last_fixed:
        warnings.warn(f"{rule.upper()} ({schedule}): {last_fixed} site updates of the final sweep "
                      f"({n_fixed} in all) met a cavity that is not a distribution or a negative site "
                      f"and were handled by on_negative={on_negative!r}: the result is not an EP fixed "
                      "point", NegativeSitesWarning, stacklevel=4)
    return post, tau, nu, n_iter, converged, n_fixed, last_fixed, adapt.info()


def single_precision(n, change, last_change, last_was_single):
    """Whether the parallel schedule refactors in single precision after a sweep that moved the sites
    by ``change`` (the one before by ``last_change``; ``last_was_single``: that one's precision).

    Yes while the change is above SINGLE_PRECISION_ABOVE, and below it down to SINGLE_PRECISION_FLOOR
    as long as single-precision sweeps keep shrinking the change by SINGLE_PRECISION_CONTRACTION: a
    sweep that does not has met the rounding of the float32 marginals (~1e-4 relative, more when
    B is ill-conditioned), and from then on every sweep is double precision.
    """
    if n < SINGLE_PRECISION_MIN_N:
        return False
    return change > SINGLE_PRECISION_ABOVE or (
        last_was_single and SINGLE_PRECISION_FLOOR < change < SINGLE_PRECISION_CONTRACTION * last_change)


def _parallel_moments(K, m0, marginals, tau, nu, single):
    """(posterior, μ, diag Σ) of the sites (τ, ν), or None if they give no finite posterior."""
    try:
        if np.all(tau >= 0):
            mu, var = marginals(tau, nu, single=single)
            post = marginals
        else:                           # EP without fixes kept negative sites: the LU posterior
            post, mu, var = _moments(K, tau, nu, m0)
    except (NotPositiveDefiniteError, np.linalg.LinAlgError):
        return None
    if not (np.all(np.isfinite(mu)) and np.all(np.isfinite(var))):
        return None
    return post, mu.copy(), var.copy()


def _site_change(tau, nu, tau_old, nu_old):
    """Largest change of a site parameter, relative to 1 + |value|."""
    return max(np.max(np.abs(tau - tau_old) / (1.0 + np.abs(tau))),
               np.max(np.abs(nu - nu_old) / (1.0 + np.abs(nu))))


def _raise_for(status, index, value, likelihood, rule):
    if status == SITE_NEGATIVE_CAVITY:
        raise NegativeVarianceError(index, value)
    if status == SITE_LIKELIHOOD_FAILED:  # valid input, a numerical failure of the method (gpc.exceptions)
        raise DivergenceError(f"{rule.upper()}: the {likelihood.name} likelihood could not be evaluated "
                              f"at site {index} (its tilted distribution underflows: the label "
                              "contradicts a confident cavity)", method=rule, index=index)
    if status == SWEEP_INDEFINITE:
        raise NotPositiveDefiniteError(f"a site update at {index} would make the posterior covariance "
                                       f"indefinite (1 + Δτ Σ_ii = {value:.3g})")
