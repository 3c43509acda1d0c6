"""Scalable EP with inducing points: the site algebra in u-space (SEP §2.2-§2.3).

Model (SEP eq. (1)): q(u) ∝ p(u | Z) Π_i φ̃_i(u) with rank-one sites, SEP eq. (2),

    φ̃_i(u) ∝ exp(-½ τ_i (v_iᵀu)² + ν_i v_iᵀu),    v_i = K_uu⁻¹ k_i,

approximating φ_i(u) = ∫ p(y_i | f) N(f | v_iᵀu, s_i) df (Φ(y_i v_iᵀu / √(1 + s_i)) for probit).
SEP's (ν̃_i, μ̃_i) are our (τ_i, ν_i).  Per datum the two scalars are kept (and, for minibatch
training, the site's direction v_i: gpc.sparse._train).

q(w) and its whitened algebra are the sparse core's (:mod:`gpc.sparse.core.natural`);
this module holds what the binary likelihood adds to it.  The BLAS-3 products run through
gpc._sparse (scipy's cython_blas); the per-row site update is the one site rule of the exact engine (gpc._site_rule.site_update, called by gpc._sparse per block),
fed with the u-space cavity and the FITC variance s_i, so that EP's on_negative policies and PL's
statistical linear regression (:class:`Rule`) serve the sparse model as they serve the dense one.

PL in u-space (``Rule("pl")``) is the exact engine's PL applied to the prior N(0, Q) of
g = (a_iᵀw)_i and the likelihoods φ_i(g): the SLR of y_i on g_i under q's marginal N(μ_i, σ_i²),
f_i = g_i + ε_i, has A = Cov[f, E(y|f)]/(σ² + s), b = E[y] - A μ, Ω = Var[y] - A²σ² (moments
under f ~ N(μ, σ² + s); PL eq. (15)-(16)), and its evidence is PL eq. (18) for that model
(docs/derivations-ep-pl.md, "Sparse PL").

The functions below are pure: a block of rows, the posterior q, the factor of K_uu and the rows'
sites in; new sites, their sums, and the block's log Z and gradient parts out, so that a
distributed engine can call them per shard and add the parts.

Threads: as in :mod:`gpc.sparse.core.natural`, by fixed sub-blocks on the caller's threads.
"""

from dataclasses import dataclass

import numpy as np

from .. import _lapack, _parallel, _sparse
from ..exceptions import NegativeVarianceError
from ..inference.rules import EP
from ..inference.pl import slr
from .core.natural import (add_blocks, add_vectors, as_vector, like_rows, partials, row_blocks,
                           rows_of)


def matched_site(likelihood, y, cmean, cvar, s):
    """Moment matching for φ_i (SEP eq. (1)): the f-integral widens the cavity by s_i.

    A NumPy reference of the compiled site rule's EP branch (gpc._site_rule, which trains;
    tested against this).

    With Z_i = ∫ p(y|f) N(f | c, v + s) df, d1 = ∂ log Z_i/∂c and d2 = ∂² log Z_i/∂c², the new
    site is τ = -d2 / (1 + d2 v), ν = (d1 - c d2) / (1 + d2 v) (R&W eq. (3.58)-(3.59) in
    derivative form).  Also returns g_s = ∂ log Z_i/∂s = ½ (d1² + d2), the derivative the
    evidence gradient needs.
    """
    vf = cvar + s
    log_z, tmean, tvar = likelihood.tilted_moments(y, cmean, vf)
    d1 = (tmean - cmean) / vf
    d2 = (tvar - vf) / vf ** 2
    denom = 1.0 + d2 * cvar
    return log_z, -d2 / denom, (d1 - cmean * d2) / denom, 0.5 * (d1 * d1 + d2)


@dataclass
class SiteUpdate:
    """What :func:`update_sites` returns for a block of rows."""

    tau: np.ndarray          # the rows' new (damped) site precisions
    nu: np.ndarray           # and locations
    dP: np.ndarray           # Aᵀ diag(τ_new - τ_old) A (m x m): the change of P
    dh: np.ndarray           # Aᵀ (ν_new - ν_old): the change of h
    n_skipped: int           # rows whose likelihood integral failed (left unchanged)
    n_fixed: int = 0         # updates the rule's on_negative policy handled


def refine_rows(likelihood, y, mean, var, s, tau, nu, damping, rule=EP, moved=None, first_row=0):
    """The compiled site rule over a block's rows (:func:`gpc._sparse.refine_rows`):
    (τ_new, ν_new, n_failed, n_fixed).  ``moved`` = (mean_old, var_old, cross) for sites held
    along earlier directions.  A cavity that is not a distribution under on_negative="raise"
    raises NegativeVarianceError naming the row (``first_row`` + its place in the block)."""
    t_new, n_new = np.empty(len(y)), np.empty(len(y))
    extra = {} if moved is None else dict(zip(("mean_old", "var_old", "cross"),
                                              map(as_vector, moved)))
    status, index, value, n_fixed, failed = _sparse.refine_rows(
        *likelihood.compiled_spec(), *rule.codes, float(damping), as_vector(y), as_vector(mean),
        as_vector(var), as_vector(s), as_vector(tau), as_vector(nu), t_new, n_new, **extra)
    if status:
        raise NegativeVarianceError(first_row + index, value)
    return t_new, n_new, failed, n_fixed


def check_filled(A, s, single=False):
    """A block's A and s that a pass fills block by block (``before``): they must be written
    where the pass reads them, C-contiguous float64 arrays (no converted copy); with ``single``
    A may be float32 (the mixed precision, :func:`gpc.sparse._train.swap_block_sites`)."""
    kinds = (np.float64, np.float32) if single else (np.float64,)
    if not (A.flags.c_contiguous and A.dtype in kinds
            and s.flags.c_contiguous and s.dtype == np.float64):
        raise ValueError("A and s, which before(j) fills, must be C-contiguous float64 arrays "
                         "(A float32 too in mixed precision)")


def update_sites(likelihood, y, A, s, q, tau, nu, damping, sums="change", rule=EP, first_row=0,
                 before=None):
    """Parallel damped update of one block's sites (SEP §2.2).

    Parameters
    ----------
    likelihood : gpc.likelihoods.Likelihood
    y : (b,) labels ±1
    A, s : whitened rows a_i and FITC variances s_i (:meth:`InducingFactor.whiten`)
    q : NaturalPosterior
    tau, nu : (b,) the rows' current sites
    damping : float in (0, 1]; new = damping · matched + (1 - damping) · old
    sums : "change" or "new"
        What ``dP, dh`` hold: the change the block's update makes to q's natural parameters
        (a minibatch step adds it to q), or the block's share of (P - I, h) for its new sites with
        the current factor (a batch pass sums these into q afresh: :func:`_passes.site_pass`).
    rule : Rule, default EP with the exact EP's on_negative
    first_row : int, the block's first row in the data (named by a NegativeVarianceError)
    before : callable, optional
        ``before(j)`` runs in sub-block j first and fills its rows of A and s (the whitening's
        blocks, :meth:`InducingFactor.whiten_blocks`: one pass instead of two).

    The rows' marginals, the site rule and the sums run by fixed sub-blocks
    (gpc._sparse.refine_block) on the caller's threads, their partial sums added in block order.
    """
    if sums not in ("change", "new"):
        raise ValueError(f"sums must be 'change' or 'new', got {sums!r}")
    if before is not None:
        check_filled(A, s)
    A = np.ascontiguousarray(A, dtype=np.float64)
    b, m = A.shape
    y, s, tau, nu = as_vector(y), as_vector(s), as_vector(tau), as_vector(nu)
    t_new, n_new = np.empty(b), np.empty(b)
    spec, codes = likelihood.compiled_spec(), rule.codes
    mode = _sparse.SUMS_CHANGE if sums == "change" else _sparse.SUMS_NEW
    blocks = row_blocks(b, m)
    dPs, dhs = partials("sums", len(blocks), m), np.empty((len(blocks), m))

    def block(j):
        if before is not None:
            before(j)
        return _sparse.refine_block(*spec, *codes, float(damping), mode,
                                    *rows_of(blocks[j], y, A, s), q.Ri, q.mean,
                                    *rows_of(blocks[j], tau, nu, t_new, n_new), dPs[j], dhs[j])
    results = _parallel.over_blocks(block, len(blocks))
    skipped, n_fixed = check_refined(results, blocks, first_row)
    dP = add_blocks(dPs, np.zeros((m, m)), lower=True)
    _lapack.mirror_lower(dP)
    return SiteUpdate(tau=t_new, nu=n_new, dP=dP, dh=add_vectors(dhs, np.zeros(m)),
                      n_skipped=skipped, n_fixed=n_fixed)


def check_refined(results, blocks, first_row=0):
    """(n_failed, n_fixed) over the blocks' results of gpc._sparse.refine_block; the first block
    (in row order) that stopped at a cavity that is not a distribution raises
    NegativeVarianceError naming its row."""
    failed = fixed = 0
    for (status, index, value, n_fixed, n_failed), (a, _) in zip(results, blocks):
        if status:
            raise NegativeVarianceError(first_row + a + index, value)
        failed += n_failed
        fixed += n_fixed
    return failed, fixed


def linearisation(likelihood, y, A, s, q):
    """PL's linearisation of each row's likelihood against q (PL eq. (15)-(16)): (slope A,
    intercept b, noise Ω on f) of y ≈ A f + b + e under f ~ N(μ_i, σ_i² + s_i), the marginal of
    f_i = a_iᵀw + ε_i.  Its site on a_iᵀw (:func:`linearised_sites`) is the one PL's rule fits."""
    mean, var = q.marginals(A)
    return slr(likelihood, mean, var + np.asarray(s, dtype=np.float64))


def linearised_sites(y, s, slope, intercept, omega):
    """The rank-one sites of the linearised likelihoods N(y_i; A_i f + b_i, Ω_i), f = a_iᵀw + ε_i
    with ε_i ~ N(0, s_i): (τ, ν, c) with τ = A²/Ω', ν = A (y - b)/Ω', Ω' = Ω + A² s (the label
    seen from a_iᵀw), and c = -½ log(2πΩ') - ½ (y - b)²/Ω', the log of the site's constant, so
    that N(y_i; A_i a_iᵀw + b_i, Ω'_i) = exp(c - ½ τ (a_iᵀw)² + ν a_iᵀw)."""
    omega_g = omega + slope * slope * s
    r = y - intercept
    return (slope * slope / omega_g, slope * r / omega_g,
            -0.5 * (np.log(2.0 * np.pi * omega_g) + r * r / omega_g))


@dataclass
class BlockEvidence:
    """A block's parts of log Z_q (SEP eq. (3)) and of its gradient (eq. (4))."""

    log_z: float          # Σ_b log Z̃_i
    G_A: np.ndarray       # the K_bu part, ∂/∂A_b (b x m), for InducingFactor.block_gradient
                          # (with block_evidence's to_kernel: ∂/∂K_bu, for kernel_gradient;
                          # None when its per_block took the rows)
    g_s: np.ndarray       # ∂/∂s_b
    AtG: np.ndarray       # the K_uu part (m x m), summed over blocks: w-space, or u-space
                          # for "cavity" with the rows' directions (see block_evidence)
    n_bad: int            # rows with a non-positive cavity (their terms are left out)
    blocks: "list | None" = None  # block_evidence's per_block results, in block order


def block_evidence(likelihood, y, A, s, q, tau, nu, gradient=True, held="sites", rule=EP,
                   to_kernel=None, directions=None, per_block=None):
    """Σ_b log Z̃_i of SEP eq. (3) and the block's parts of its gradient, eq. (4).

    Under ``rule`` PL the same sum is PL eq. (18) for the sparse model (log p̂(D) plus the
    correction integrals, exactly), and the gradient is that of log p̂(D), the linearised model's
    Gaussian evidence, at a fixed linearisation: the formulas below with the row derivatives (d1,
    g_s, e) of the Gaussian pseudo-likelihood each site stands for (gpc._site_rule.site_log_z;
    docs/derivations-ep-pl.md, "Sparse PL").

    log Z̃_i = log Z_i + g(θ^{\\i}) - g(θ) = log Z_i + ½ log(1 + τ_i v_c) + ½ c²/v_c - ½ μ²/σ²
    for the cavity N(c, v_c) and the marginal N(μ, σ²) of a_iᵀw.

    The gradient holds the sites while θ and Z move; ``held`` says how, and both forms agree at
    an EP fixed point (tested against finite differences):

    ``"sites"``: each site follows its row, along a_i = L⁻¹k_i of the current factor, as in a
    batch pass, which rebuilds q from the sites every time.  With Q = A Aᵀ, log Z_q is exact
    EP's evidence for the prior N(0, Q) and the likelihoods φ_i, whose noise s_i enters through
    Z_i only; at a fixed point the cavity terms are stationary, so (R&W eq. (5.27))

        dF = tr(M_Q dQ) + Σ_i g_s,i ds_i,   M_Q = ½ (β βᵀ - (Q + T⁻¹)⁻¹),   β = ν - T μ,

    and by Woodbury (Q + T⁻¹)⁻¹ A = T A Σ_w and Aᵀβ = μ_w.  With s_i = k_ii - |a_i|²,
    G_A = ∂F/∂A = β μ_wᵀ - T A Σ_w - 2 diag(g_s) A, and AtG = Aᵀ G_A for
    InducingFactor.uu_gradient.  Every row's term carries its own site (β_i), so the rows must
    all be equally fresh: right for a batch pass.

    ``"cavity"``: each site is fixed in u-space (SEP §2.3, q "reconstructed"), as minibatches
    keep them.  SEP eq. (4) proper: the prior term (η - η_prior)ᵀ ∂θ_prior/∂ξ
    (:func:`prior_term`, from q alone) plus Σ_i ∂ log Z_i/∂ξ with each cavity q^{\\i}(u) held.
    log Z_i = log ∫ p(y_i|f) N(f | v_iᵀm_c, v_iᵀV_c v_i + s_i) df depends on ξ through
    v_i = K_uu⁻¹k_i and s_i = k_ii - k_iᵀK_uu⁻¹k_i; with d1 = ∂ log Z_i/∂c, g_s = ∂ log Z_i/∂s_i
    and γ_i = d1 μ_c + 2 g_s Σ_c a_i (the cavity's whitened mean and covariance),

        ∂ log Z_i/∂k_i = L⁻ᵀ(γ_i - 2 g_s a_i),
        ∂ log Z_i/∂K_uu = L⁻ᵀ(g_s a_i a_iᵀ - γ_i a_iᵀ)L⁻¹,   ∂ log Z_i/∂k_ii = g_s.

    The cavity is q less the row's site, Σ_c a_i = Σ_w a_i v_c/σ² and μ_c = μ_w + Σ_w a_i (τμ_i -
    ν_i) v_c/σ², so γ_i = d1 μ_w + e_i Σ_w a_i (e_i from :func:`gpc._sparse.evidence_rows`).
    G_A has rows γ_i - 2 g_s a_i and AtG = Σ_b (g_s a_i - γ_i) a_iᵀ, the w-space K_uu part for
    :func:`gpc.sparse.core.passes.finish_evidence`.  With ``directions``, the rows' v_i = L⁻ᵀa_i
    (b x m, A's dtype; the minibatch's site swap makes them) and ``to_kernel``, both come in
    u-space instead: G_A := ∂F/∂K_bu with rows L⁻ᵀ(γ_i - 2 g_s a_i), and AtG := L⁻ᵀ(the w-space
    AtG)L⁻¹ = -Σ_b (L⁻ᵀ(γ_i - g_s a_i)) v_iᵀ, the rows' ∂F/∂K_uu before symmetrising
    (finish_evidence's ``u_space``).  The rows' terms depend on their cavities, not on their own
    sites, so a minibatch refined just before the gradient is a fair sample of all rows (the
    "sites" form weighted them by their fresh sites: the mean over minibatches was +550 in log c
    where the converged gradient was +20, and the amplitude ran away).

    Either form costs A Σ_w (two triangular products with R⁻¹) and one m x b x m product, and
    with ``to_kernel`` (the factor's L⁻¹) G_A is returned as G_A L⁻¹ = ∂F/∂K_bu, what the
    kernel's contraction takes (:meth:`InducingFactor.kernel_gradient`): a third triangular
    product.  With ``directions`` the cavity form needs two in all: R⁻¹a_i and (R⁻¹L⁻¹)ᵀ R⁻¹a_i
    = L⁻ᵀΣ_w a_i (R⁻¹L⁻¹ once, m³/6).  The rows and their m x k x m products run by fixed
    sub-blocks (gpc._sparse.evidence_block) on the caller's threads, the blocks' sums added in
    block order.  ``per_block(start, stop, G_A rows, g_s rows)``, when given, runs in each block
    after its rows (a kernel contraction that releases the GIL, :func:`gpc.sparse._passes.block_parts`);
    its results come back in block order as ``blocks``.

    Float32 rows A (and ``directions``; the mixed precision of minibatch SEP,
    gpc.sparse._train) run these products in single precision with float32 copies of the m x m
    factors (gpc._sparse.evidence_block); log Z, g_s and AtG are float64, G_A comes back as
    float64, and ``per_block`` takes its rows in float32 (the kernel's contraction against a
    float32 K_bu, :meth:`InducingFactor.whiten`).
    """
    if held not in ("sites", "cavity"):
        raise ValueError(f"held must be 'sites' or 'cavity', got {held!r}")
    A = np.ascontiguousarray(A, dtype=np.float32 if A.dtype == np.float32 else np.float64)
    b, m = A.shape
    y, s, tau, nu = as_vector(y), as_vector(s), as_vector(tau), as_vector(nu)
    g_s = np.empty(b)
    G = np.empty((b, m), dtype=A.dtype) if gradient else None
    spec = likelihood.compiled_spec()
    blocks = row_blocks(b, m)
    AtGs = partials("evidence", len(blocks), m) if gradient else None
    RiLi = None
    per_block = per_block if gradient else None
    if not (gradient and held == "cavity"):
        directions = None
    elif directions is not None:
        if to_kernel is None:
            raise ValueError("the u-space gradient (directions given) needs to_kernel (the "
                             "factor's L⁻¹)")
        if directions.shape != A.shape:
            raise ValueError(f"directions are {directions.shape[0]} x {directions.shape[1]}, A "
                             f"is {b} x {m}")
        RiLi = q.to_u(to_kernel)                                # R⁻¹L⁻¹, m³/6
    Ri, to_kernel, RiLi = like_rows(A, q.Ri, to_kernel, RiLi)

    def block(j):
        grads = (rows_of(blocks[j], G)[0], AtGs[j]) if gradient else (None, None)
        V = None if directions is None else rows_of(blocks[j], directions)[0]
        part = _sparse.evidence_block(*spec, rule.codes[0], held == "cavity",
                                      *rows_of(blocks[j], y, A, s), Ri, q.mean,
                                      *rows_of(blocks[j], tau, nu, g_s), *grads, to_kernel, RiLi, V)
        if per_block is None:
            return part, None
        G_rows, g_rows = rows_of(blocks[j], G, g_s)
        return part, per_block(*blocks[j], G_rows, g_rows)
    parts = _parallel.over_blocks(block, len(blocks))
    total = 0.0
    for (part, _), _ in parts:
        total += part
    n_bad = sum(bad for (_, bad), _ in parts)
    if not gradient:
        return BlockEvidence(total, None, None, None, n_bad)
    extra = None if per_block is None else [out for _, out in parts]
    # G_A's rows went to per_block when it was given; else G_A is the caller's, in float64
    G_A = None if per_block is not None else G.astype(np.float64, copy=False)
    return BlockEvidence(total, G_A, g_s, add_blocks(AtGs, np.zeros((m, m))), n_bad, extra)

