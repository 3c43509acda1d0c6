"""The inducing-point geometry every sparse method shares (SEP §2.1-§2.2).

With inducing inputs Z (m x d) and values u = f(Z), K_uu = L Lᵀ is held by its Cholesky factor only
(never inverted).  For a block of rows X_b the module gives

* ``A_b = K_bu L⁻ᵀ`` (rows a_i = L⁻¹ k_i: the whitened form of SEP's v_i = K_uu⁻¹ k_i, v_i = L⁻ᵀ a_i),
* ``s_b = k_ii - |a_i|²``, the FITC conditional variance s_i of SEP eq. (1),

and turns the matrix derivatives of an objective F with respect to K_bu, K_uu and diag K_bb into the
derivative with respect to the kernel's log hyperparameters and to Z.  The kernel answers for its
blocks itself, through the object it binds to Z (``kernel._bound_to(Z)``, a
:class:`gpc.kernels.base.BoundKernel`, made once per factor, i.e. per θ and Z): K_uu (``gram``),
K_bu of a chunk of rows (``cross``), diag K_bb, the b x m contraction of a chunk
(``cross_gradient``, in θ and Z) and that of K_uu (``gram_gradient``), so no n x m x p tensor is
formed and nothing here depends on the kernel's kind.

Threads: the kernel is called on fixed chunks of rows, which depend on the rows and the bound
object only: where its chunks release the GIL (``nogil``, the squared exponential's compiled
path) they are blocks of about gpc._parallel.BLOCK_WORK multiply-adds (``row_work`` a row); else
at least KERNEL_ROWS rows (:func:`kernel_chunks`: each call holds the GIL for its Python).  The
whitening runs by fixed blocks of rows (gpc._parallel.row_blocks); all of it on the threads of the
caller's gpc._parallel.block_threads context, chunk sums added in chunk order.
"""

import numpy as np

from ... import _lapack, _parallel, _sparse
from ..._linalg import cholesky_lower
from .natural import like_rows

#: rows of one call to the kernel at least (a call holds the GIL for tens of microseconds of
#: Python, worth it from about this many rows on)
KERNEL_ROWS = 512
#: calls to the kernel per pass at most (their Python queues for the GIL)
KERNEL_CHUNKS = 8


def kernel_chunks(b):
    """The fixed chunks of b rows that the kernel is called on (they depend on b only)."""
    return _parallel.row_blocks(b, _parallel.BLOCK_WORK / KERNEL_ROWS, KERNEL_CHUNKS)


class InducingFactor:
    """K_uu = L Lᵀ for one kernel and one Z; ``jitter`` (relative to the mean diagonal) is added first.

    Parameters
    ----------
    kernel : gpc.kernels.Kernel
    Z : ndarray (m, d)
    jitter : float
        Added to the diagonal of K_uu as ``jitter * mean(diag K_uu)``; 0 is allowed (the Z = X check).
    invert : bool, default True
        Form L⁻¹ now; with False, ``Li`` is None until :meth:`invert` (a caller that runs it
        beside other work: :func:`gpc.sparse.core.natural.transform_natural`).
    """

    def __init__(self, kernel, Z, jitter=1e-8, invert=True):
        self.kernel = kernel
        self.Z = np.ascontiguousarray(Z, dtype=np.float64)
        self.bound = kernel._bound_to(self.Z)
        self.Kuu = self.bound.gram()
        _lapack.mirror_lower(self.Kuu)                         # exactly symmetric
        m = self.Kuu.shape[0]

        def jittered():
            Kj = self.Kuu.copy()
            Kj.flat[:: m + 1] += jitter * float(np.trace(Kj)) / m
            return Kj

        self.L, _ = cholesky_lower(jittered(), name="K_uu (kernel at the inducing points)",
                                   overwrite=True, rebuild=jittered)
        self.Li = self._inverse = None
        if invert:
            self.invert()

    def invert(self):
        """Form ``Li`` = L⁻¹ (one nogil LAPACK call).  Explicit: every product with it is a
        triangular multiply (dtrmm), cheaper than a triangular solve (dtrsm), and serves the
        whitening, the gradient and the move of q to a new factor alike."""
        Li = self.L.copy()
        _lapack.lower_inverse_in_place(Li)        # L has a positive diagonal: never singular
        self.Li = Li

    def inverse(self):
        """K_uu⁻¹ = L⁻ᵀL⁻¹ (m x m, both triangles; dlauum of ``Li``, m³/6, once; the caller must
        not write to it): the prior term's -K_uu⁻¹ in u-space (:func:`gpc.sparse.core.natural.prior_term_u`).
        :meth:`prefetch_inverse` may have started it."""
        if self._inverse is None:
            self._inverse = self._gram_of_inverse()
        elif isinstance(self._inverse, _parallel.Deferred):
            self._inverse = self._inverse.result()
        return self._inverse

    def prefetch_inverse(self):
        """Form :meth:`inverse` as a side task beside the caller's next pass of blocks
        (gpc._parallel.defer; it reads ``Li`` alone, which nothing writes)."""
        if self._inverse is None:
            self._inverse = _parallel.defer(self._gram_of_inverse)

    def _gram_of_inverse(self):
        K = np.empty_like(self.Li)
        _lapack.lower_gram(self.Li, K)
        return K

    @property
    def m(self):
        return self.L.shape[0]

    def chunks(self, b):
        """The fixed chunks of b rows that the kernel is called on: blocks of about BLOCK_WORK
        for a bound object whose chunks release the GIL, else :func:`kernel_chunks`."""
        bound = self.bound
        if bound.nogil:
            return _parallel.row_blocks(b, bound.row_work)
        return kernel_chunks(b)

    def cross(self, Xb):
        """K_bu (b x m), the kernel called on fixed chunks of rows (:meth:`chunks`)."""
        chunks = self.chunks(Xb.shape[0])
        if len(chunks) <= 1:
            return self.bound.cross(Xb)
        K = np.empty((Xb.shape[0], self.m))
        cross = self.bound.cross

        def chunk(j):
            a, c = chunks[j]
            cross(Xb[a:c], K[a:c])
        _parallel.over_blocks(chunk, len(chunks))
        return K

    def diag(self, Xb):
        """diag K_bb."""
        return self.bound.diag(Xb)

    def whiten(self, Xb, keep_cross=False, out=None):
        """(A_b, s_b): A_b = K_bu L⁻ᵀ and s_b = diag K_bb - rowsum(A_b²), clipped at 0 (rounding).

        With ``keep_cross`` also K_bu, which :meth:`block_gradient` can reuse, and A_b goes into
        ``out`` (b x m, C-contiguous) when given; a float32 ``out`` takes A_b in single
        precision (the product with L⁻ᵀ in float32, s_b summed in float64: the mixed precision
        of gpc.sparse._train), and K_bu is float32 too where the bound kernel's chunks release
        the GIL (their b x d x m products and exponentials in single precision), else K_bu
        rounded to float32.

        Where the bound kernel's chunks release the GIL, each block of rows makes its own K_bu
        rows and whitens them in one task (one pass over the threads instead of two; a row's
        kernel values do not depend on the chunk it is computed in)."""
        block, n_blocks, result = self.whiten_blocks(Xb, keep_cross, out)
        _parallel.over_blocks(block, n_blocks)
        return result

    def whiten_blocks(self, Xb, keep_cross=False, out=None):
        """:meth:`whiten` as (block, n_blocks, result): ``block(j)`` fills the result's rows of
        fixed block j (``gpc.sparse.core.natural.row_blocks(b, m)``, one nogil call, and with a compiled
        kernel its K_bu rows first), for a caller whose own pass takes block j's rows right
        after (:func:`gpc.sparse._train.swap_block_sites`'s ``before``).  A kernel that holds
        the GIL is called here, on its chunks, before any block."""
        b, m = Xb.shape[0], self.m
        kdiag = np.ascontiguousarray(self.diag(Xb), dtype=np.float64)
        fused = self.bound.nogil
        dtype = np.float64 if out is None or not keep_cross else out.dtype
        Kbu = (np.empty((b, m), dtype=dtype) if fused
               else np.ascontiguousarray(self.cross(Xb), dtype=np.float64))
        A = (np.empty_like(Kbu) if out is None else out) if keep_cross else Kbu
        s = np.empty(b)
        blocks = _parallel.row_blocks(b, m * m)
        cross, (Li,) = self.bound.cross, like_rows(A, self.Li)
        rounded = Kbu.dtype != A.dtype                  # a GIL-holding kernel's K_bu, float32 A

        def block(j):
            a, c = blocks[j]
            if fused:
                cross(Xb[a:c], Kbu[a:c])
            K = Kbu[a:c]
            if rounded:
                A[a:c] = K
                K = A[a:c]
            _sparse.whiten_block(Li, K, A[a:c], kdiag[a:c], s[a:c])
        return block, len(blocks), ((A, s, Kbu) if keep_cross else (A, s))

    def block_gradient(self, Xb, G_A, g_s, Kbu=None, overwrite=False):
        """Kernel and Z gradient of the K_bu and diag K_bb parts of dF.

        ``G_A`` is the total ∂F/∂A_b (b x m), the part through s = diag K_bb - rowsum(A²)
        included, and ``g_s`` is ∂F/∂s_b (b,).  Since A_b = K_bu L⁻ᵀ, ∂F/∂K_bu = G_A L⁻¹, and
        ∂F/∂k_ii = g_s.  ``Kbu`` (from :meth:`whiten`) saves recomputing the kernel block; with
        ``overwrite`` G_A (C-contiguous) is the scratch of the products.

        Returns (g_theta (p,), g_Z (m, d)).
        """
        G_bu = G_A if overwrite else np.array(G_A, dtype=np.float64, order="C")
        blocks = _parallel.row_blocks(*G_bu.shape[:1], self.m * self.m)
        _parallel.over_blocks(
            lambda j: _lapack.multiply_triangular_rows(self.Li, G_bu[slice(*blocks[j])], True),
            len(blocks))                                        # G_A L⁻¹
        return self.kernel_gradient(Xb, G_bu, g_s, Kbu)

    def kernel_gradient(self, Xb, G_bu, g_s, Kbu=None):
        """Kernel and Z gradient of F's K_bu and diag K_bb parts from ∂F/∂K_bu (``G_bu``, b x m,
        C-contiguous, used as scratch) and ∂F/∂k_ii (``g_s``): the bound kernel's b x m
        contraction (``cross_gradient``) on fixed chunks of rows (:meth:`chunks`), summed in chunk
        order.

        Returns (g_theta (p,), g_Z (m, d))."""
        chunks = self.chunks(Xb.shape[0])

        def chunk(j):
            a, c = chunks[j]
            return self.chunk_gradient(Xb, Kbu, a, c, G_bu[a:c],
                                       None if g_s is None else g_s[a:c])
        return add_gradients(_parallel.over_blocks(chunk, len(chunks)))

    def chunk_gradient(self, Xb, Kbu, start, stop, G_rows, g_rows=None):
        """Rows start:stop's part of :meth:`kernel_gradient` (the bound kernel's
        ``cross_gradient``; ``G_rows``, those rows of ∂F/∂K_bu, is scratch): (g_theta, g_Z).  A
        compiled kernel (``bound.nogil``) releases the GIL here, so the evidence's blocks can take
        their own rows' parts (:func:`gpc.sparse._passes.block_parts`)."""
        g_theta, g_Z = self.bound.cross_gradient(Xb[start:stop], G_rows, g_rows,
                                                 None if Kbu is None else Kbu[start:stop])
        return g_theta, _inputs_or_zero(g_Z, self.Z)

    def uu_gradient(self, AtG):
        """Kernel and Z gradient of the K_uu part, given Σ_b A_bᵀ G_A,b (m x m) at fixed K_bu.

        A = K_fu L⁻ᵀ gives ∂F/∂L = -L⁻ᵀ (AᵀG_A)ᵀ, and the Cholesky factor's reverse rule
        (Murray 2016) ∂F/∂K_uu = sym(L⁻ᵀ Φ(Lᵀ ∂F/∂L) L⁻¹), Φ = lower triangle with its diagonal
        halved.  When F depends on A only through A Aᵀ, AᵀG_A is symmetric and this is
        -L⁻ᵀ AᵀG_A L⁻¹ / 2; SVI's whitened mean makes it non-symmetric.
        """
        # sym(L⁻ᵀ Φ L⁻¹) = L⁻ᵀ sym(Φ) L⁻¹
        G = np.empty_like(self.L)
        _sparse.symmetric_from_upper(np.ascontiguousarray(AtG, dtype=np.float64), G, -0.5)
        return self.uu_gradient_whitened(G, overwrite=True)

    def uu_gradient_whitened(self, G, overwrite=False):
        """Kernel and Z gradient of ∂F/∂K_uu = L⁻ᵀ G L⁻¹ for a symmetric w-space G (m x m): one
        congruence with the explicit L⁻¹ (gpc._lapack.congruence: its lower triangle by fixed
        column panels on the block threads), then :meth:`uu_gradient_u`.  With ``overwrite`` G
        (C-contiguous) is the scratch."""
        G_uu = G if overwrite else np.array(G, dtype=np.float64, order="C")
        _lapack.congruence(self.Li, G_uu)
        return self.uu_gradient_u(G_uu)

    def uu_gradient_u(self, G_uu):
        """Kernel and Z gradient of a symmetric ∂F/∂K_uu (m x m, C-contiguous): the kernel's
        contraction with ∂K_uu/∂θ and ∂K_uu/∂Z."""
        g_theta, g_Z = self.bound.gram_gradient(G_uu, self.Kuu)
        return g_theta, _inputs_or_zero(g_Z, self.Z)


def add_gradients(parts):
    """Σ of (g_theta, g_Z) pairs in their order (chunks or blocks: the same bits at any thread
    count)."""
    g_theta, g_Z = parts[0]
    for gt, gz in parts[1:]:
        g_theta = g_theta + gt
        g_Z = g_Z + gz
    return g_theta, g_Z


def _inputs_or_zero(g_Z, Z):
    """The gradient in Z, or zeros for a kernel without one (the estimator then keeps Z fixed)."""
    return np.zeros_like(Z) if g_Z is None else g_Z
