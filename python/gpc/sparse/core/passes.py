"""Passes over row blocks of any row-sliceable array, and the evidence's last, model-free part.

The rows come from any array with row slicing (NumPy, ``np.memmap``, a Dask array): a block is read
with ``X[start:stop]`` and converted to a float64 NumPy array, so only one block is in memory.
A pass returns sums over its rows only (O(m²)), taken in row order (:func:`add_parts`); that is
what a shard of a distributed fit sends back.  :func:`finish_evidence` adds what comes from q and
the factor alone (SEP eq. (3)-(4)), so both sparse models finish their evidence here.
"""

import numpy as np

from ... import _parallel
from .natural import prior_term, prior_term_u


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
    """(start, stop) of consecutive blocks of ``block_rows`` rows covering n rows."""
    return [(i, min(i + block_rows, n)) for i in range(0, n, block_rows)]


def add_parts(total, part):
    """Running sum of two blocks' parts (None starts it), so a pass holds one set of sums."""
    if total is None:
        return part
    return tuple(None if a is None else a + b for a, b in zip(total, part))


def finish_evidence(factor, q, parts, scale=1.0, held="sites", u_space=False):
    """From the summed block parts add the K_uu part: (log_z, g_theta, g_Z, n_bad).

    ``scale`` multiplies the data terms (n/|M| for a minibatch, SEP eq. (6)).  With ``held`` =
    "sites" (gpc.sparse.ep.block_evidence) the prior's part rides on the per-row terms and is
    scaled with them; with "cavity" it is eq. (4)'s prior term, from q alone and not scaled, and
    with ``u_space`` the rows' K_uu part is in u-space (block_evidence given the rows'
    directions).  Either way a minibatch of all the data gives the batch value.  The K_bu part may
    still be a side task (gpc.sparse._passes.block_parts with ``later``): it runs beside the K_uu
    part's congruence panels.
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
