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

Default ``on_negative="clip"``: the PL paper's experiments (§IV) clip as Vehtari et al. suggest, and it
keeps fits of non-log-concave likelihoods running; a NegativeSitesWarning counts the clipped updates.
Log-concave likelihoods (probit, logit) never produce negative sites without damping artefacts.
"""

import functools

import numpy as np

from ..posterior import SitePosterior
from ._result import InferenceResult
from ._damping import DEFAULT_MIN_DAMPING, check_min_damping
from ._sites import check_options, run_schedule

DEFAULT_MAX_ITER = 100
DEFAULT_TOL = 1e-6


def run(K, y, likelihood, prior_mean, *, schedule="sequential", max_iter=None, tol=None,
        damping=1.0, on_negative="clip", order=None, random_state=None, block=None, init=None,
        min_damping=DEFAULT_MIN_DAMPING):
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
        ``info["damping_halved_at"]`` lists (sweep, new damping) per halving.
    min_damping : float or None, default 2⁻¹⁰
        The parallel schedule stops with a DivergenceError rather than halve the damping below this.
        None keeps the damping fixed (the plain parallel schedule).
    on_negative : "clip" (default), "raise", "skip" or "pl"
        What a negative cavity or site variance does (module docstring, _sites.py).
    order : None, "random" or a permutation
        Visiting order of the sequential schedule (``random_state`` seeds "random").
    block : int, default 64
        Rank-one updates deferred and applied together (1 = the plain rank-one sweep).
    init : InferenceResult, optional
        Warm start from its sites (the optimiser passes the previous result).
    """
    check_options(damping, on_negative, schedule)
    min_damping = check_min_damping(min_damping, damping)
    max_iter = DEFAULT_MAX_ITER if max_iter is None else max_iter
    tol = DEFAULT_TOL if tol is None else tol
    m0 = prior_mean
    post, tau, nu, n_iter, converged, n_fixed, damping_info = run_schedule(
        K, y, likelihood, m0, rule="ep", schedule=schedule, max_iter=max_iter, tol=tol,
        damping=damping, on_negative=on_negative, order=order, random_state=random_state,
        block=block, init=init, converged_by="sites", min_damping=min_damping)
    log_evidence = ep_log_evidence(post, y, likelihood, m0)
    return InferenceResult("ep", schedule, likelihood, post, log_evidence, n_iter, converged,
                           post.gradient_matrix,
                           info={"n_negative_handled": n_fixed, **damping_info},
                           lower_gradient_matrix=lower_gradient_matrix(post))


def lower_gradient_matrix(post):
    """The lower-triangle-only gradient matrix of a SitePosterior (None for the signed one)."""
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
