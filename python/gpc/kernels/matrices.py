"""Kernel matrices of the stationary kernels: squared distances, Gram matrices and the compiled
passes of gpc._kernels that turn them into K (row ranges shared out by gpc._parallel.over_rows)."""

import numpy as np
from scipy.linalg.blas import dgemm as _dgemm, dsyrk as _dsyrk

from .. import _kernels, _lapack
from .._lapack import mirror_lower
from .._parallel import over_rows


def _sqdist(U, V=None):
    """Squared Euclidean distances between rows, by |u|^2 + |v|^2 - 2 u.v, clipped at 0.

    With V None the Gram part comes from dsyrk (half the flops of gemm) and the result is exactly
    symmetric with an exactly zero diagonal.  Callers centre the inputs first so the cancellation
    error stays at the scale of the data's spread.
    """
    su = np.einsum("ij,ij->i", U, U)
    if V is None:
        # dsyrk on the Fortran-ordered U fills the upper triangle of a Fortran array; its transpose
        # is a C-ordered array holding the lower triangle.
        R2 = _dsyrk(-2.0, np.asfortranarray(U)).T
        with np.errstate(invalid="ignore"):     # inputs beyond 1e154: inf − inf on the diagonal,
            R2 += su[:, None]                   # which is set to its exact 0 below
            R2 += su[None, :]
        mirror_lower(R2)  # after the additions, which are not symmetric in rounding
        np.fill_diagonal(R2, 0.0)
    else:
        sv = np.einsum("ij,ij->i", V, V)
        R2 = U @ V.T
        R2 *= -2.0
        R2 += su[:, None]
        R2 += sv[None, :]
    np.maximum(R2, 0.0, out=R2)
    return R2


def _gram_lower(U):
    """(G, su): G C-ordered with U U^T in its lower triangle (dsyrk), su_i = |u_i|^2."""
    U = np.ascontiguousarray(U, dtype=np.float64)
    su = np.einsum("ij,ij->i", U, U)
    G = np.empty((U.shape[0], U.shape[0]))
    _lapack.row_gram_lower(U, G)          # into uninitialised memory: no zero fill of n x n
    return G, su


#: up to this many input dimensions, stationary kernels form distances directly (gpc._kernels
#: gram_direct / contract_direct); above, from a BLAS Gram matrix
DIRECT_MAX_D = 8


#: rows per block of the vectorised exponential in _gram
_EXP_ROWS = 64


def _gram(U, V, kind, scale=1.0):
    """K = scale * f(r^2) between the rows of U and V (V None: U itself) for a stationary ``kind``.

    K(U, U): the strict lower triangle first holds r^2, or for the squared exponential its
    exponent -r^2/2, from direct differences (few dimensions) or a BLAS Gram matrix;
    NumPy's vectorised exp then makes the values (the exponentials are most of the kernel matrix's
    cost, and a vectorised exp is far cheaper than a scalar one per entry) by row blocks of the
    lower triangle, and one pass
    sets the diagonal and mirrors.  The Matérn kinds, whose polynomial factor needs care at
    r = inf, take the scalar pass of gpc._kernels.
    """
    if V is not None:
        # U V^T through scipy's BLAS (the BLAS of the solves that follow a cross-covariance)
        G = _dgemm(1.0, V, U, trans_b=True).T
        su, sv = np.einsum("ij,ij->i", U, U), np.einsum("ij,ij->i", V, V)
        if kind != _kernels.RBF:
            over_rows(_kernels.cross_to_kernel, G.shape[0], G, su, sv, kind, scale, cost="rows")
            return G
        over_rows(_cross_exp, G.shape[0], G, su, sv, scale, cost="rows")
        return G
    n = U.shape[0]
    rbf = kind == _kernels.RBF
    factor = -0.5 if rbf else 1.0
    if U.shape[1] <= DIRECT_MAX_D:
        K = np.empty((n, n))
        over_rows(_kernels.sqdist_direct, n, np.ascontiguousarray(U.T), K, 0.0, factor)
    else:
        K, su = _gram_lower(U)
        over_rows(_kernels.gram_to_sqdist, n, K, su, 0.0, factor)
    if not rbf:
        over_rows(_kernels.sqdist_to_kernel, n, K, kind, scale)
        return K
    over_rows(_exp_and_finish, n, K, scale)
    return K


def _exp_and_finish(K, scale, *, start, stop):
    """Rows start..stop-1 of a squared exponential's K from its exponents (strict lower triangle):
    NumPy's exp by row blocks (it releases the GIL), then the diagonal, c * exp(...) (the rounding
    of c * K, not of exp(log c - ...)) and the mirror in one pass (gpc._kernels.finish_kernel)."""
    # a block's columns run to its last row: the upper corner of its diagonal square is scratch
    # (overwritten by the mirror of these rows), whatever it holds
    with np.errstate(over="ignore", invalid="ignore"):
        for i0 in range(start, stop, _EXP_ROWS):
            i1 = min(i0 + _EXP_ROWS, stop)
            block = K[i0:i1, :i1]
            np.exp(block, out=block)
    _kernels.finish_kernel(K, scale, scale != 1.0, start=start, stop=stop)


def _cross_exp(G, su, sv, scale, *, start, stop):
    """Rows start..stop-1 of a squared exponential's cross-covariance from G = U Vᵀ."""
    _kernels.cross_sqdist(G, su, sv, -0.5, start=start, stop=stop)
    block = G[start:stop]
    np.exp(block, out=block)
    if scale != 1.0:
        block *= scale


def _sum_parts(parts):
    """The sums of a pass's row ranges, added in range order (the same bits for any number of
    threads): a tuple of totals, one per returned item."""
    totals = list(parts[0])
    for part in parts[1:]:
        for k, item in enumerate(part):
            totals[k] = totals[k] + item
    return tuple(totals)
