"""Expectation propagation (Minka 2001; R&W §3.6, Alg. 3.5 and 5.2; NR eq. (11)-(13)).

Each site t̃_i(f_i) = exp(−½ τ̃_i f_i² + ν̃_i f_i) is set so that cavity × site matches the first two
moments of cavity × p(y_i|f_i) (R&W eq. (3.56)-(3.59)).  Sequential and parallel schedules and the
policy for negative variances are those of the site engine (``_sites.py``).

Evidence (NR eq. (13); R&W eq. (3.65) written with natural parameters so that it stays finite for
τ̃_i = 0): with the cavities (τ_c, ν_c) at the fixed point, Z_i the tilted normaliser,
h = K⁻¹ m0 + ν̃ and α = (I + T K)⁻¹ (ν̃ − T m0),

    log Z_EP = Σ_i [ log Z_i + ½ log(1 + τ̃_i/τ_c,i) − ½ (ν̃_i + ν_c,i)²/(τ̃_i + τ_c,i) + ½ ν_c,i²/τ_c,i ]
               − ½ log|B| + ½ (αᵀ m0 + μᵀ ν̃),

(the per-site terms are log of the site normalisers; the rest is log ∫ N(f|m0, K) Π t̃_i df;
docs/derivations-ep-pl.md).  Gradient at the fixed point (R&W Alg. 5.2): M = ½ (α αᵀ − R),
R = S B⁻¹ S.

Negative site variances (non-log-concave likelihoods such as the noisy threshold; ``_sites.py``;
docs/guide/negative_variances.rst).  A site precision τ̃_i < 0 is part of EP: the tilted distribution
is wider than the cavity.  The default ``on_negative="keep"`` (``DEFAULT_ON_NEGATIVE``) keeps such
sites while every cavity and the posterior stay positive definite, so the fixed point and its
evidence are EP's own.  Only an update that EP cannot make falls back: a site without a cavity
(τ_c,i ≤ 0) takes PL's SLR update against its marginal (PL eq. (15)-(16)) if that keeps its
marginal precision positive, else keeps its old value, as does a sequential rank-one update that
would make Σ indefinite (1 + Δτ Σ_ii ≤ 0); a parallel update whose posterior cannot be formed is
retried with half the damping (``_damping``).  The PL paper's experiments (§IV) instead clip every
negative site precision to 1e-8 (``on_negative="clip"``, kept for their reproduction): that moves
the fixed point, by 62 nats of evidence on 80 rows of crabs with the noisy threshold at ε = 0.05.
Log-concave likelihoods (probit, logit) never produce negative sites, and there every policy is the
same.

The result's ``info`` says what happened: ``n_fallback``, the updates of the final sweep that the
policy handled (a fallback, or under "clip", "skip" and "pl" a replaced negative site);
``ep_fixed_point``, True when the run converged with no such update in its final sweep (every site
is then its own EP update to ``tol``, and the evidence is that of an EP fixed point);
``n_negative_sites``, the negative site precisions kept; ``n_negative_handled``, the updates the
policy handled over the whole run.  A final sweep that needed the policy also warns
(``NegativeSitesWarning``).
"""

import functools

import numpy as np

from ..exceptions import DivergenceError
from ..posterior import SitePosterior
from ._result import InferenceResult
from ._damping import DEFAULT_MIN_DAMPING, check_min_damping
from ._sites import check_options, negative_site_remedies, run_schedule
from .rules import DEFAULT_ON_NEGATIVE

DEFAULT_MAX_ITER = 100
DEFAULT_TOL = 1e-6


def run(K, y, likelihood, prior_mean, *, schedule="sequential", max_iter=None, tol=None,
        damping=1.0, on_negative=DEFAULT_ON_NEGATIVE, order=None, random_state=None, block=None,
        init=None, min_damping=DEFAULT_MIN_DAMPING):
    """Expectation propagation.

    Parameters
    ----------
    schedule : "sequential" or "parallel"
    max_iter : int, default 100
        Sweeps over the sites.
    tol : float, default 1e-6
        On the largest change of a site parameter (relative to 1 + |value|) in a sweep.
    damping : float in (0, 1], default 1
        New natural parameters = damping × matched + (1 − damping) × old (RMGPC §3).  The parallel
        schedule starts from it and halves it whenever its updates oscillate or fail
        (gpc.inference._damping); ``info["damping"]`` is the final value and
        ``info["damping_halved_at"]`` lists (sweep, new damping) per halving.  A ``tol`` below the
        rounding level of the updates ends there, converged, with ``info["rounding_floor"]``.
    min_damping : float or None, default 2⁻¹⁰
        The parallel schedule stops with a DivergenceError rather than halve the damping below this.
        None keeps the damping fixed (the plain parallel schedule).
    on_negative : "keep" (default), "keep-skip", "raise", "clip", "skip" or "pl"
        What a negative cavity or site variance does (``_sites.py``).  "keep", "keep-skip" and
        "raise" keep negative sites (EP's own fixed point) and differ where a site has no cavity:
        PL's update for that site ("keep"), its old value ("keep-skip"), NegativeVarianceError
        ("raise").  "clip" (the PL paper's §IV) sets every negative site precision to 1e-8, "skip"
        keeps the old site instead of every negative update, "pl" gives it PL's update: these three
        keep every τ̃ ≥ 0 and move the fixed point.
    order : None, "random" or a permutation
        Visiting order of the sequential schedule (``random_state`` seeds "random").
    block : int, default 64
        Rank-one updates deferred and applied together (1 = the plain rank-one sweep).
    init : InferenceResult, optional
        Warm start from its sites (the optimiser passes the previous result).  Sites that give no
        posterior with this K (negative ones, fitted to another kernel) start the run cold.
    """
    check_options(damping, on_negative, schedule)
    min_damping = check_min_damping(min_damping, damping)
    max_iter = DEFAULT_MAX_ITER if max_iter is None else max_iter
    tol = DEFAULT_TOL if tol is None else tol
    m0 = prior_mean
    post, tau, nu, n_iter, converged, n_fixed, n_fallback, damping_info = run_schedule(
        K, y, likelihood, m0, rule="ep", schedule=schedule, max_iter=max_iter, tol=tol,
        damping=damping, on_negative=on_negative, order=order, random_state=random_state,
        block=block, init=init, converged_by="sites", min_damping=min_damping)
    log_evidence = ep_log_evidence(post, y, likelihood, m0)
    if not np.isfinite(log_evidence):
        _raise_for_missing_cavity(post, schedule, on_negative)
    info = {"n_negative_handled": n_fixed, "n_fallback": n_fallback,
            "n_negative_sites": int(np.count_nonzero(tau < 0)),
            "ep_fixed_point": bool(converged and n_fallback == 0 and np.isfinite(log_evidence)),
            **damping_info}
    return InferenceResult("ep", schedule, likelihood, post, log_evidence, n_iter, converged,
                           post.gradient_matrix, info=info,
                           lower_gradient_matrix=lower_gradient_matrix(post))


def _raise_for_missing_cavity(post, schedule, on_negative):
    """A DivergenceError naming the first site whose final cavity is not a distribution, if any.

    Such a site was left by the policy's fallback (e.g. "keep-skip" where the old site is what makes
    the cavity negative): the sites are no EP fixed point and have no EP evidence."""
    tau_c = 1.0 / post.diag_cov() - post.site_precision
    bad = np.flatnonzero(~(tau_c > 0))
    if bad.size:
        i = int(bad[0])
        fallback = {"keep": "where PL's update could not make it one either",
                    "keep-skip": "on_negative='keep' would refit such a site by PL's update"}
        why = f" ({fallback[on_negative]})" if on_negative in fallback else ""
        raise DivergenceError(
            f"EP ({schedule}): {bad.size} site(s) end without a cavity (site {i}: cavity precision "
            f"{tau_c[i]:.3g}) after on_negative={on_negative!r} kept them{why}; no EP fixed point, "
            f"so no EP evidence.  {negative_site_remedies(schedule, on_negative)}",
            method="ep", index=i, value=float(tau_c[i]))


def lower_gradient_matrix(post):
    """The lower-triangle-only gradient matrix of a SitePosterior (the signed one is one too)."""
    if isinstance(post, SitePosterior):
        return functools.partial(post.gradient_matrix, lower=True)
    return None


def ep_log_evidence(post, y, likelihood, m0):
    """log Z_EP of the module docstring at the sites of ``post``."""
    tau, nu = post.site_precision, post.site_location
    mu, var = post.mean, post.diag_cov()
    tau_c = 1.0 / var - tau
    nu_c = mu / var - nu
    cav_mean, cav_var = nu_c / tau_c, 1.0 / tau_c
    if not (np.all(tau_c > 0) and np.all(np.isfinite(cav_mean)) and np.all(cav_var > 0)
            and np.all(np.isfinite(cav_var))):
        # a site whose cavity is not a distribution (after "clip"/"skip", or a posterior variance
        # that is zero to rounding: a Heaviside site of unbounded precision): its tilted normaliser
        # does not exist, and neither does the EP evidence
        return -np.inf
    # log Z_i = −inf where a confident cavity contradicts its label (Heaviside): the evidence is 0,
    # which infer reports; the moments of such a tilted distribution are not needed here
    log_z = likelihood.log_tilted_normaliser(y, cav_mean, cav_var)
    site_terms = (log_z + 0.5 * np.log1p(tau / tau_c) - 0.5 * (nu + nu_c) ** 2 / (tau + tau_c)
                  + 0.5 * nu_c ** 2 / tau_c)
    return float(np.sum(site_terms) - 0.5 * post.log_det_B + 0.5 * (post.alpha @ m0 + mu @ nu))
