"""The binary model's passes over row blocks (gpc.sparse.core.passes): the batch EP sweep and
the evidence with its gradient.

Every pass returns sums over its rows only (O(m²)), taken in row order; that is what a shard of a
distributed fit sends back (:mod:`gpc.sparse._distributed`).  Within a block the work runs on the
caller's threads (gpc.sparse.ep, gpc._parallel.block_threads).
"""

from functools import partial

import numpy as np

from .. import _parallel
from .core.inducing import add_gradients
from .core.natural import NaturalPosterior, whitened_sums
from .core.passes import add_parts, as_block, block_ranges, finish_evidence
from .ep import EP, block_evidence, linearisation, linearised_sites, update_sites


def site_pass(likelihood, X, y, factor, q, tau, nu, damping, block_rows, rule=EP):
    """One parallel pass of the site rule ``rule`` (SEP §2.2): every site from the same q.

    Returns (tau, nu, dP, dh, skipped, n_fixed): the new sites, (P - I, h) of the new sites with
    the current factor (q is rebuilt from them, not updated: after a θ or Z step the old sites'
    sums, carried over in u-space, no longer equal what the sites give with the new factor, and
    adding changes to them let that difference accumulate until EP broke down), how many rows
    kept their sites because their likelihood integral failed, and how many updates the rule's
    on_negative policy handled.
    """
    m = factor.m
    tau, nu = tau.copy(), nu.copy()
    dP, dh = np.zeros((m, m)), np.zeros(m)
    skipped = n_fixed = 0
    for start, stop in block_ranges(len(y), block_rows):
        A, s = factor.whiten(as_block(X, start, stop))
        up = update_sites(likelihood, y[start:stop], A, s, q, tau[start:stop], nu[start:stop],
                          damping, sums="new", rule=rule, first_row=start)
        tau[start:stop], nu[start:stop] = up.tau, up.nu
        dP += up.dP
        dh += up.dh
        skipped += up.n_skipped
        n_fixed += up.n_fixed
    return tau, nu, dP, dh, skipped, n_fixed


def block_parts(likelihood, Xb, y, A, s, factor, q, tau, nu, gradient=True, Kbu=None,
                held="sites", rule=EP, later=False, directions=None):
    """One block's share of log Z_q and of its gradient: (log_z, g_theta, g_Z, AtG, n_bad);
    ``held``, ``rule`` and ``directions`` as in :func:`ep.block_evidence`.

    The kernel's contraction of the K_bu part: with a compiled kernel (``bound.nogil``) and K_bu
    at hand, inside the evidence's own blocks of rows (one pass fewer), their parts added in
    block order.  Otherwise a pass of its own, and with ``later``, when the kernel takes the block
    in one call (:meth:`_inducing.InducingFactor.chunks`; larger blocks share their chunks out
    among the threads themselves), a side task (gpc._parallel.defer) beside the caller's next
    pass of blocks, g_theta, g_Z then one :class:`gpc._parallel.Deferred` of the pair, which
    :func:`finish_evidence` resolves."""
    fused = (partial(factor.chunk_gradient, Xb, Kbu)
             if gradient and Kbu is not None and factor.bound.nogil else None)
    ev = block_evidence(likelihood, y, A, s, q, tau, nu, gradient=gradient, held=held, rule=rule,
                        to_kernel=factor.Li if gradient else None, directions=directions,
                        per_block=fused)
    if not gradient:
        return ev.log_z, None, None, None, ev.n_bad
    if fused is not None:
        return (ev.log_z, *add_gradients(ev.blocks), ev.AtG, ev.n_bad)
    if later and len(factor.chunks(len(Xb))) <= 1:
        pair = _parallel.defer(partial(factor.kernel_gradient, Xb, ev.G_A, ev.g_s, Kbu))
        return ev.log_z, pair, pair, ev.AtG, ev.n_bad
    g_theta, g_Z = factor.kernel_gradient(Xb, ev.G_A, ev.g_s, Kbu)
    return ev.log_z, g_theta, g_Z, ev.AtG, ev.n_bad


def evidence_parts(likelihood, X, y, factor, q, tau, nu, block_rows, gradient=True,
                   held="sites", rule=EP):
    """The summed block parts of log Z_q over all rows of X (before :func:`finish_evidence`)."""
    parts = None
    for start, stop in block_ranges(len(y), block_rows):
        Xb = as_block(X, start, stop)
        A, s, Kbu = factor.whiten(Xb, keep_cross=True)
        parts = add_parts(parts, block_parts(likelihood, Xb, y[start:stop], A, s, factor, q,
                                             tau[start:stop], nu[start:stop], gradient, Kbu,
                                             held, rule))
    return parts


def evidence(likelihood, X, y, factor, q, tau, nu, block_rows, gradient=True, held="sites",
             rule=EP):
    """log Z_q (SEP eq. (3); under ``rule`` PL, PL eq. (18) for the sparse model) and, with
    ``gradient``, its derivative in log θ and in Z (the sites ``held`` as in
    :func:`ep.block_evidence`; PL: that of log p̂(D) at a fixed linearisation).

    Returns (log_z, g_theta, g_Z, n_bad), n_bad counting rows without a proper cavity.
    """
    return finish_evidence(factor, q, evidence_parts(likelihood, X, y, factor, q, tau, nu,
                                                     block_rows, gradient, held, rule), held=held)


def linearisation_of(likelihood, X, y, factor, q, block_rows):
    """PL's linearisation (slope, intercept, noise on f) of every row against q
    (:func:`ep.linearisation`), three (n,) arrays."""
    parts = [linearisation(likelihood, y[start:stop], *factor.whiten(as_block(X, start, stop)), q)
             for start, stop in block_ranges(len(y), block_rows)]
    return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))


def linearised_evidence(X, y, factor, slope, intercept, omega, block_rows):
    """log p̂(D) = log N(y; b, Ã (Q + diag s) Ã + Ω), the Gaussian evidence of the sparse model
    with every likelihood replaced by its linearisation N(y_i; A_i f_i + b_i, Ω_i) (held fixed),
    at the factor's θ and Z (Q = K_fu K_uu⁻¹ K_uf, s the FITC variances): the analogue of PL
    eq. (17), computed through q of the linearisation's sites (:func:`ep.linearised_sites`),

        log p̂(D) = ½ hᵀP⁻¹h - ½ log|P| + Σ_i c_i,

    which is what sparse PL's gradient differentiates (docs/derivations-ep-pl.md)."""
    m = factor.m
    P, h, const = np.eye(m), np.zeros(m), 0.0
    for start, stop in block_ranges(len(y), block_rows):
        A, s = factor.whiten(as_block(X, start, stop))
        tau, nu, c = linearised_sites(y[start:stop], s, slope[start:stop], intercept[start:stop],
                                      omega[start:stop])
        dP, dh = whitened_sums(A, tau, nu)
        P += dP
        h += dh
        const += float(np.sum(c))
    return NaturalPosterior(0.5 * (P + P.T), h).log_normaliser_ratio() + const
