"""Passes over row blocks of the data: the batch EP sweep and the evidence with its gradient.

The rows come from any array with row slicing (NumPy, ``np.memmap``, a Dask array): a block is read
with ``X[start:stop]`` and converted to a float64 NumPy array, so only one block is in memory.
"""

import numpy as np

from .ep import block_evidence, build_posterior, update_sites


def as_block(X, start, stop):
    """Rows start:stop of any row-sliceable array as a C-contiguous float64 array."""
    block = X[start:stop]
    if hasattr(block, "compute"):      # a Dask array
        block = block.compute()
    return np.ascontiguousarray(block, dtype=np.float64)


def block_ranges(n, block_rows):
    return [(i, min(i + block_rows, n)) for i in range(0, n, block_rows)]


def site_pass(likelihood, X, y, factor, q, tau, nu, damping, block_rows):
    """One parallel EP pass (SEP §2.2): every site from the same q; returns new sites and sums."""
    m = factor.m
    tau, nu = tau.copy(), nu.copy()
    S2, S1, skipped = np.zeros((m, m)), np.zeros(m), 0
    for start, stop in block_ranges(len(y), block_rows):
        A, s = factor.whiten(as_block(X, start, stop))
        up = update_sites(likelihood, y[start:stop], A, s, factor.unwhiten_rows(A), q,
                          tau[start:stop], nu[start:stop], damping)
        tau[start:stop], nu[start:stop] = up.tau, up.nu
        S2 += up.S2_new
        S1 += up.S1_new
        skipped += up.n_skipped
    return tau, nu, 0.5 * (S2 + S2.T), S1, skipped


def evidence(likelihood, X, y, factor, q, tau, nu, block_rows, gradient=True, scale=1.0):
    """log Z_q (SEP eq. (3)) and, with ``gradient``, its derivative in log θ and in Z.

    ``scale`` multiplies the data terms (n/|M| for a minibatch, SEP eq. (6)); the prior part of
    the gradient is carried by the same per-row terms (see ``block_evidence``), so it is scaled
    with them and the full-data value is recovered when the minibatch is all the data.
    Returns (log_z, g_theta, g_Z, n_bad).
    """
    m = factor.m
    total, n_bad = 0.0, 0
    g_theta = np.zeros(len(factor.kernel.theta))
    g_Z = np.zeros_like(factor.Z)
    AtG = np.zeros((m, m))
    for start, stop in block_ranges(len(y), block_rows):
        A, s = factor.whiten(as_block(X, start, stop))
        ev = block_evidence(likelihood, y[start:stop], A, s, q, tau[start:stop], nu[start:stop],
                            gradient=gradient)
        total += ev.log_z
        n_bad += ev.n_bad
        if gradient:
            gt, gz = factor.block_gradient(as_block(X, start, stop), ev.G_A, ev.g_s)
            g_theta += gt
            g_Z += gz
            AtG += ev.AtG
    log_z = q.log_normaliser_ratio() + scale * total
    if not gradient:
        return log_z, None, None, n_bad
    gt, gz = factor.uu_gradient(scale * AtG)
    return log_z, scale * g_theta + gt, scale * g_Z + gz, n_bad


def run_ep(likelihood, X, y, factor, tau, nu, damping=0.5, max_iter=200, tol=1e-9,
           block_rows=4096):
    """Parallel damped EP at fixed θ and Z until the sites move less than ``tol`` (max abs)."""
    m = factor.m
    S2 = np.zeros((m, m))
    S1 = np.zeros(m)
    if np.any(tau) or np.any(nu):
        tau, nu, S2, S1, _ = site_pass(likelihood, X, y, factor, build_posterior(factor.L, S2, S1),
                                       tau, nu, 0.0, block_rows)
    q = build_posterior(factor.L, S2, S1)
    for it in range(1, max_iter + 1):
        new_tau, new_nu, S2, S1, _ = site_pass(likelihood, X, y, factor, q, tau, nu, damping,
                                               block_rows)
        change = max(np.max(np.abs(new_tau - tau)), np.max(np.abs(new_nu - nu)))
        tau, nu = new_tau, new_nu
        q = build_posterior(factor.L, S2, S1)
        if change < tol:
            return tau, nu, q, it, True
    return tau, nu, q, max_iter, False
