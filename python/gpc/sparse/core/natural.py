"""The sparse core's posterior: q(w) and its algebra in whitened coordinates (SEP §2.2-§2.3).

Every sparse model here holds, per latent function, q(u) ∝ p(u | Z) Π_i φ̃_i(u) with sites that
are rank one along the rows' directions v_i = K_uu⁻¹ k_i (SEP eq. (2)), whatever the likelihood
that matched them.  Everything is computed whitened: u = L w with K_uu = L Lᵀ, so p(w) = N(0, I),
v_iᵀu = a_iᵀw with a_i = L⁻¹ k_i, and q(w) ∝ exp(-½ wᵀPw + hᵀw) with the natural parameters

    P = I + Σ_i τ_i a_i a_iᵀ,    h = Σ_i ν_i a_i

(the u-space sums S2 = Σ τ_i v_i v_iᵀ = L⁻ᵀ(P - I)L⁻¹ and S1 = L⁻ᵀh that q needs, seen through
the current factor).  q is held by the inverse of the Cholesky factor of P ⪰ I alone (never
K_uu⁻¹, never P⁻¹) (:class:`NaturalPosterior`): refining a block of sites adds Aᵀ diag(Δτ) A and
Aᵀ Δν to (P, h), an O(b m²) product (:func:`whitened_sums`), and a step of θ or Z from L to L'
keeps the sites (SEP §2.3: q is "reconstructed") by :func:`transform_natural`,
P' = I + Mᵀ(P - I)M with M = L⁻¹L', O(m³).  The evidence's gradient parts that do not depend on
the likelihood are here too: the rows' part from their coefficients (:func:`rows_gradient`) and
the prior term of SEP eq. (4) (:func:`prior_term`, :func:`prior_term_u`).

Threads: a block's rows are cut into fixed sub-blocks (:func:`row_blocks`), each one compiled call
of gpc._sparse with the GIL released, run by gpc._parallel.over_blocks on the threads of the
caller's gpc._parallel.block_threads context (one thread outside one).  A sub-block writes its own
rows and its own m x m partial sums, added in block order (:func:`add_blocks`), so the results are
the same bits whatever the threads.
"""

import threading
from dataclasses import dataclass
from functools import partial

import numpy as np

from ... import _lapack, _parallel, _sparse
from ...exceptions import NotPositiveDefiniteError


@dataclass
class Posterior:
    """q(w) = N(mean, cov) held by its covariance (SVI's q(w) = N(μ, L_q L_qᵀ)).

    Attributes
    ----------
    mean : (m,) the mean of w
    cov : (m, m) its covariance
    """

    mean: np.ndarray
    cov: np.ndarray

    def marginals(self, A):
        """Mean and variance of a_iᵀw for the rows a_i of A (by blocks of rows on the caller's
        threads)."""
        A = np.ascontiguousarray(A, dtype=np.float64)
        mean, var = np.empty(len(A)), np.empty(len(A))
        blocks = row_blocks(*A.shape)

        def block(j):
            Ab, mb, vb = rows_of(blocks[j], A, mean, var)
            np.matmul(Ab, self.mean, out=mb)
            np.einsum("ij,ij->i", Ab @ self.cov, Ab, out=vb)
        _parallel.over_blocks(block, len(blocks))
        return mean, var


def _gram(T):
    """TᵀT (m x m, both triangles, a new array) for lower-triangular T (dlauum, m³/6)."""
    C = np.empty_like(T)
    _lapack.lower_gram(T, C)
    return C


class NaturalPosterior:
    """q(w) ∝ exp(-½ wᵀPw + hᵀw) from its natural parameters, held by the inverse R⁻¹ of P's
    Cholesky factor (P = R Rᵀ, R lower): products with it are triangular multiplies (dtrmm), which
    run at twice the speed of triangular solves (dtrsm) at m = 200.

    Raises NotPositiveDefiniteError when P (negative sites) has no Cholesky factor or the
    parameters are not finite.

    Parameters
    ----------
    P : (m, m) symmetric precision I + Σ τ_i a_i a_iᵀ
    h : (m,) linear natural parameter Σ ν_i a_i
    """

    def __init__(self, P, h):
        Ri = np.array(P, dtype=np.float64, order="C")
        m = len(Ri)
        diag, mean = np.empty(m), np.empty(m)
        # R := R⁻¹ and P⁻¹ h = R⁻ᵀ R⁻¹ h in one nogil call
        if _lapack.natural_factor(Ri, as_vector(h), diag, np.empty(m), mean) != 0:
            raise NotPositiveDefiniteError("q(u)'s precision I + Σ τ_i a_i a_iᵀ is not positive "
                                           "definite")
        self.logdet = 2.0 * float(np.sum(np.log(diag)))
        # a non-finite P or h leaves its trace in the factor's diagonal or in the mean
        if not (np.isfinite(self.logdet) and np.isfinite(mean).all()):
            raise NotPositiveDefiniteError("the site sums are not finite")
        self.P, self.h, self.Ri, self.mean = P, h, Ri, mean
        self._cov = self._to_u = self._sigma = None

    def solve_rows(self, A, out=None):
        """B = A R⁻ᵀ (b x m): rows R⁻¹ a_i, so that |B[i]|² = a_iᵀ P⁻¹ a_i (``out``: scratch for
        B, may be A)."""
        if out is None:
            out = np.array(A, dtype=np.float64, order="C")
        elif out is not A:
            np.copyto(out, A)
        return times_lower_rows(self.Ri, out, False)

    def marginals(self, A, out=None):
        """Mean and variance of a_iᵀw for the rows a_i of A (one triangular product; ``out``,
        b x m, is scratch)."""
        return self.moments(A, out, covariance=False)[:2]

    def moments(self, A, out=None, covariance=True):
        """(marginal means, variances, A Σ_w) for the rows of A: two triangular products
        (``out``, b x m, may hold A Σ_w; without ``covariance`` one product, and B = A R⁻ᵀ)."""
        calls, result = self.moments_blocks(A, out, covariance)
        _parallel.over_calls(calls)
        return result

    def moments_blocks(self, A, out=None, covariance=True):
        """:meth:`moments` as (calls, (mean, var, B)): ``calls[j]()`` fills the results' rows of
        fixed block j (one nogil call of gpc._sparse.marginal_block), for a caller that runs them
        together with other blocks (gpc._parallel.over_calls)."""
        A = np.ascontiguousarray(A, dtype=np.float64)
        b, m = A.shape
        B = np.empty((b, m)) if out is None else out
        mean, var = np.empty(b), np.empty(b)
        calls = [partial(_sparse.marginal_block, self.Ri, self.mean,
                         *rows_of(block, A, B, mean, var), covariance)
                 for block in row_blocks(b, m)]
        return calls, (mean, var, B)
    @property
    def cov(self):
        """Σ_w = P⁻¹ = R⁻ᵀ R⁻¹ (formed on demand, a new array; the one :meth:`prefetch_cov`
        started, if any, goes to the first reader)."""
        return self._take_gram(None)

    @property
    def kept_cov(self):
        """Σ_w as :attr:`cov` gives it, formed once and kept, read-only: for readers that do not
        write to it (the prior term of the gradient and the tied evidence read it in one step)."""
        if self._sigma is None:
            self._sigma = self._take_gram(None)
            self._sigma.flags.writeable = False
        return self._sigma

    def cov_u(self, Li):
        """Σ_w seen in u-space, L⁻ᵀ Σ_w L⁻¹ = (R⁻¹L⁻¹)ᵀ(R⁻¹L⁻¹) for the factor's L⁻¹ ``Li`` (a
        new array: the Gram product of :meth:`to_u`, m³/6, where the congruence of Σ_w by L⁻¹
        takes m³/2); the one :meth:`prefetch_cov` started for this ``Li``, if any, goes to the
        first reader."""
        return self._take_gram(Li)

    def prefetch_cov(self, Li=None):
        """Form :attr:`cov` (with ``Li``, :meth:`cov_u`) as a side task of the caller's block
        threads (gpc._parallel.defer: beside the next pass of blocks), for its first reader.
        With ``Li`` the product :meth:`to_u` is taken now (the next pass reads it too)."""
        T = self.Ri if Li is None else self.to_u(Li)
        self._cov = Li, _parallel.defer(partial(_gram, T))

    def _take_gram(self, Li):
        pending, self._cov = self._cov, None
        if pending is not None and pending[0] is Li:
            return pending[1].result()
        return _gram(self.Ri if Li is None else self.to_u(Li))

    def to_u(self, Li):
        """R⁻¹L⁻¹ (lower triangular; a product of two triangles, m³/6, kept for this ``Li``): with
        it (R⁻¹L⁻¹)ᵀ R⁻¹a_i = L⁻ᵀ Σ_w a_i, the rows of the cavity form's u-space gradient
        (:func:`block_evidence`), and its Gram product is :meth:`cov_u`."""
        if self._to_u is None or self._to_u[0] is not Li:
            RiLi = np.array(Li, dtype=np.float64, order="C")
            _lapack.lower_lower_times(self.Ri, RiLi)              # R⁻¹L⁻¹
            self._to_u = Li, RiLi
        return self._to_u[1]

    def log_normaliser_ratio(self):
        """g(θ) - g(θ_prior) of SEP eq. (3): ½ hᵀ P⁻¹ h - ½ log|P| (in w, where g(θ_prior) is that
        of N(0, I); the whitening's Jacobian cancels in the difference)."""
        return 0.5 * float(self.h @ self.mean) - 0.5 * self.logdet


def row_blocks(b, m):
    """The fixed blocks of b rows against m inducing points that a pass shares out among threads
    (gpc._parallel.row_blocks with a row's work m², about what its whitening and marginals cost)."""
    return _parallel.row_blocks(b, m * m)


def like_rows(A, *factors):
    """The m x m ``factors`` in the precision of the rows A: themselves for float64 rows, float32
    copies for float32 rows (the mixed precision's single-precision products, gpc._sparse);
    None stays None."""
    if A.dtype == np.float64:
        return factors
    return tuple(None if F is None else np.ascontiguousarray(F, dtype=A.dtype) for F in factors)


def rows_of(block, *arrays):
    """Rows ``block`` = (start, stop) of each array (C-contiguous views)."""
    rows = slice(*block)
    return tuple([x[rows] for x in arrays])


def times_lower_rows(T, B, transpose):
    """Each row b of B := T b, or Tᵀ b with ``transpose`` (T lower triangular, m x m), in place:
    the rows' triangular products (dtrmm) by blocks of rows on the caller's threads."""
    blocks = row_blocks(*B.shape)
    _parallel.over_blocks(
        lambda j: _lapack.multiply_triangular_rows(T, rows_of(blocks[j], B)[0], transpose),
        len(blocks))
    return B


_scratch = threading.local()


def partials(name, n, m):
    """Scratch for n blocks' m x m partial sums (n x m x m), kept per thread and per ``name``
    between calls (a fresh one would be paged in at every step)."""
    key = f"parts_{name}"
    buf = getattr(_scratch, key, None)
    if buf is None or buf.shape[0] < n or buf.shape[1] != m:
        buf = np.empty((n, m, m))
        setattr(_scratch, key, buf)
    return buf[:n]


def add_blocks(parts, out, lower=False):
    """out (m x m) += Σ_j parts[j], the blocks' partial sums added in block order, by fixed row
    stripes on the caller's threads (gpc._sparse.sum_blocks); with ``lower`` the lower triangles
    only.  Returns out."""
    nb, m, _ = parts.shape
    stripes = _parallel.row_stripes(m, nb * m * (m + 1) / (2 if lower else 1), lower)
    _parallel.over_blocks(lambda j: _sparse.sum_blocks(parts, out, *stripes[j], lower),
                          len(stripes))
    return out


def add_vectors(parts, out):
    """out += Σ_j parts[j] (rows of ``parts``) in block order."""
    for part in parts:
        out += part
    return out


def whitened_sums(A, tau, nu, work=None):
    """(Aᵀ diag(τ) A, Aᵀ ν): a block's share of (P - I, h), its rows by fixed sub-blocks (two
    dsyrk each, by the sign of τ: gpc._sparse.weighted_sums_block) on the caller's threads;
    ``work`` is not needed (kept for callers that pass scratch)."""
    calls, finish = whitened_sums_blocks(A, tau, nu)
    _parallel.over_calls(calls)
    return finish()


def whitened_sums_blocks(A, tau, nu, scratch="sums"):
    """:func:`whitened_sums` as (calls, finish): ``calls[j]()`` writes fixed block j's partial
    sums (one nogil call), ``finish()`` adds them in block order and returns (dP, dh).  Callers
    that run several such sets at once give each its own ``scratch`` name (:func:`partials`)."""
    A = np.ascontiguousarray(A, dtype=np.float64)
    b, m = A.shape
    tau, nu = as_vector(tau), as_vector(nu)
    blocks = row_blocks(b, m)
    dPs, dhs = partials(scratch, len(blocks), m), np.empty((len(blocks), m))
    calls = [partial(_sparse.weighted_sums_block, *rows_of(block, A, tau, nu), dPs[j], dhs[j])
             for j, block in enumerate(blocks)]

    def finish():
        dP = add_blocks(dPs, np.zeros((m, m)), lower=True)
        _lapack.mirror_lower(dP)
        return dP, add_vectors(dhs, np.zeros(m))
    return calls, finish


def transform_natural(P, h, Li_old, L_new, beside=()):
    """(P', h') for the same sites seen from a new factor L' of K_uu (after a θ or Z step).

    The sites are fixed in u-space (S2 = L⁻ᵀ(P - I)L⁻¹, S1 = L⁻ᵀh), so with M = L⁻¹L'
    (lower triangular) P' = I + Mᵀ(P - I)M and h' = Mᵀh: a product of two triangles with the
    explicit L⁻¹ (``Li_old``; m³/6 multiply-adds, no solve) and the symmetric congruence by fixed
    column panels on the caller's threads (gpc._lapack.congruence, about m³/2; P' exactly
    symmetric).  ``L_new`` is lower triangular with a zero strict upper triangle (a factor of
    :class:`InducingFactor`).  ``beside``: calls independent of all this (the new factor's
    :meth:`InducingFactor.invert`, which the move does not need), run on the caller's threads
    together with the product M.
    """
    m = P.shape[0]
    M = np.array(L_new, dtype=np.float64, order="C")
    if beside:
        _parallel.over_calls([partial(_lapack.lower_lower_times, Li_old, M), *beside])
    else:
        _lapack.lower_lower_times(Li_old, M)                                 # M = L⁻¹ L'
    S = np.array(P, dtype=np.float64, order="C")
    S.flat[:: m + 1] -= 1.0
    P_new = _lapack.congruence(M, S, np.empty((m, m)))         # exactly symmetric
    P_new.flat[:: m + 1] += 1.0
    return P_new, M.T @ h


def as_vector(v):
    """v as a C-contiguous float64 array (converted only when it is not one)."""
    return np.ascontiguousarray(v, dtype=np.float64)


def rows_gradient(A, q, G_A, mean, tau, nu, g_s, d1, e, held):
    """The rows' parts of the evidence gradient (:func:`block_evidence`, either ``held`` form)
    from their coefficients: G_A (holding A Σ_w on entry) := ∂F/∂A for
    :meth:`InducingFactor.block_gradient`, and the returned AtG (m x m), the rows' K_uu part.

    "sites": G_A = β μ_wᵀ - diag(τ) A Σ_w - 2 diag(g_s) A with β = ν - τ ⊙ mean (the rows' site
    totals τ, ν and marginal means), AtG = Aᵀ G_A.  "cavity": G_A = d1 μ_wᵀ + diag(e) A Σ_w -
    2 diag(g_s) A, AtG = -Σ_b (γ_i - g_s a_i) a_iᵀ.  A multi-class row (several sites on one row,
    gpc.multiclass.sparse) passes its sites' sums (docs/derivations-sparse-multiclass.md §6).
    """
    AtG = np.empty((A.shape[1], A.shape[1]))
    if held == "sites":
        _sparse.site_rows_gradient(G_A, A, nu - tau * mean, q.mean, tau, g_s)
        _lapack.transpose_times(A, G_A, AtG)
    else:
        Y = np.empty_like(G_A)
        _sparse.cavity_rows_gradient(G_A, Y, A, d1, q.mean, e, g_s)
        _lapack.transpose_times(Y, A, AtG)                   # Σ_b (γ_i - g_s a_i) a_iᵀ
        AtG *= -1.0
    return AtG


def prior_term(q):
    """The prior term of SEP eq. (4), (η - η_prior)ᵀ ∂θ_prior/∂ξ, as a w-space K_uu derivative:
    ∂/∂K_uu = L⁻ᵀ G L⁻¹ with G = ½(Σ_w + μ_w μ_wᵀ - I), the u-space ½ K⁻¹(E_q[uuᵀ] - K)K⁻¹."""
    G = q.kept_cov + np.outer(q.mean, q.mean)
    G.flat[:: len(G) + 1] -= 1.0
    G *= 0.5
    return G


def prior_term_u(q, factor):
    """:func:`prior_term` in u-space, ∂/∂K_uu = L⁻ᵀ G L⁻¹ itself, without the congruence:
    ½(L⁻ᵀΣ_wL⁻¹ + ν νᵀ - K_uu⁻¹) with ν = L⁻ᵀμ_w, the first from R⁻¹L⁻¹
    (:meth:`NaturalPosterior.cov_u`) and the last from L⁻¹ (:meth:`InducingFactor.inverse`), two
    Gram products of m³/6 each where the congruence takes m³/2 (exactly symmetric, as each of its
    terms)."""
    G = q.cov_u(factor.Li)
    nu = factor.Li.T @ q.mean
    G += np.outer(nu, nu)
    G -= factor.inverse()
    G *= 0.5
    return G


def posterior_predict(A, s, q):
    """Latent predictive mean and variance at rows with whitened A and FITC variance s."""
    mean, var = q.marginals(A)
    return mean, var + s
