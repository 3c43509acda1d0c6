"""Passes over row blocks of the data: the batch EP sweep and the evidence with its gradient.

The rows come from any array with row slicing (NumPy, ``np.memmap``, a Dask array): a block is read
with ``X[start:stop]`` and converted to a float64 NumPy array, so only one block is in memory.
Every pass returns sums over its rows only (O(m²)), taken in row order; that is what a shard of a
distributed fit sends back (:mod:`gpc.sparse._distributed`).  Within a block the work runs on the
caller's threads (gpc.sparse.ep, gpc._parallel.block_threads).
"""

from functools import partial

import numpy as np

from .. import _parallel
from ._inducing import add_gradients
from .ep import (EP, NaturalPosterior, block_evidence, linearisation, linearised_sites, prior_term,
                 prior_term_u, update_sites, whitened_sums)


def as_block(X, start, stop):
    """Rows start:stop of any row-sliceable array as a C-contiguous float64 array."""
    block = X[start:stop]
    if hasattr(block, "compute"):      # a Dask array
        block = block.compute()
    block = np.ascontiguousarray(block, dtype=np.float64)
    if not np.isfinite(block).all():
        raise ValueError(f"X contains NaN or inf (in rows {start}:{stop})")
    return block


def block_ranges(n, block_rows):
    return [(i, min(i + block_rows, n)) for i in range(0, n, block_rows)]


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


def natural_sums(X, factor, tau, nu, block_rows):
    """(P, h) = (I + Σ τ_i a_i a_iᵀ, Σ ν_i a_i) of given sites with the current factor."""
    m = factor.m
    P, h = np.eye(m), np.zeros(m)
    if not (np.any(tau) or np.any(nu)):
        return P, h
    for start, stop in block_ranges(len(tau), block_rows):
        A, _ = factor.whiten(as_block(X, start, stop))
        dP, dh = whitened_sums(A, tau[start:stop], nu[start:stop])
        P += dP
        h += dh
    return P, h


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


def add_parts(total, part):
    """Running sum of two blocks' parts (None starts it), so a pass holds one set of sums."""
    if total is None:
        return part
    return tuple(None if a is None else a + b for a, b in zip(total, part))


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


def finish_evidence(factor, q, parts, scale=1.0, held="sites", u_space=False):
    """From the summed block parts add the K_uu part: (log_z, g_theta, g_Z, n_bad).

    ``scale`` multiplies the data terms (n/|M| for a minibatch, SEP eq. (6)).  With ``held`` =
    "sites" (:func:`ep.block_evidence`) the prior's part rides on the per-row terms and is scaled
    with them; with "cavity" it is eq. (4)'s prior term, from q alone and not scaled, and with
    ``u_space`` the rows' K_uu part is in u-space (:func:`ep.block_evidence` given the rows'
    directions).  Either way a minibatch of all the data gives the batch value.  The
    K_bu part may still be a side task (:func:`block_parts` with ``later``): it runs beside the
    K_uu part's congruence panels.
    """
    log_z, g_theta, g_Z, AtG, n_bad = parts
    log_z = q.log_normaliser_ratio() + scale * log_z
    if g_theta is None:
        return log_z, None, None, n_bad
    if held == "sites":
        gt, gz = factor.uu_gradient(scale * AtG)
    elif u_space:
        G = prior_term_u(q, factor)
        G += (0.5 * scale) * (AtG + AtG.T)
        gt, gz = factor.uu_gradient_u(G)
    else:
        G = prior_term(q)
        G += (0.5 * scale) * (AtG + AtG.T)
        gt, gz = factor.uu_gradient_whitened(G, overwrite=True)
    if isinstance(g_theta, _parallel.Deferred):
        g_theta, g_Z = g_theta.result()
    return log_z, scale * g_theta + gt, scale * g_Z + gz, n_bad


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


def run_ep(likelihood, X, y, factor, tau, nu, damping=0.5, max_iter=200, tol=1e-9,
           block_rows=4096, rule=EP):
    """Parallel damped passes of the site rule ``rule`` (EP by default) at fixed θ and Z until the
    sites move less than ``tol`` (max abs).

    Returns (tau, nu, q, passes, converged, n_fixed), n_fixed the updates the rule's on_negative
    policy handled over all passes.  A pass whose sites give q no factor (negative sites kept by
    on_negative="raise") raises NotPositiveDefiniteError.
    """
    P, h = natural_sums(X, factor, tau, nu, block_rows)
    q = NaturalPosterior(P, h)
    n_fixed = 0
    for it in range(1, max_iter + 1):
        new_tau, new_nu, dP, dh, _, fixed = site_pass(likelihood, X, y, factor, q, tau, nu,
                                                      damping, block_rows, rule)
        n_fixed += fixed
        change = max(np.max(np.abs(new_tau - tau)), np.max(np.abs(new_nu - nu)))
        tau, nu = new_tau, new_nu
        dP.flat[:: factor.m + 1] += 1.0
        q = NaturalPosterior(0.5 * (dP + dP.T), dh)
        if change < tol:
            return tau, nu, q, it, True, n_fixed
    return tau, nu, q, max_iter, False, n_fixed
