"""Stationary kernels k = f(r) of the scaled distance r: the squared exponential (RBF) and Matérn."""

import math

import numpy as np
from scipy.linalg.blas import dgemm as _dgemm

from .. import _kernels
from .._parallel import over_rows
from . import matrices
from .base import BoundKernel, Kernel
from .matrices import _gram, _gram_lower, _sqdist, _sum_parts


class _Stationary(Kernel):
    """k = f(r), r^2 = sum_d (x_d - y_d)^2 / l_d^2.  Subclasses give f and W = -f'(r)/r of R2.

    The kernel matrix and the gradient contraction run in gpc._kernels (one pass over the lower
    triangle after a BLAS Gram matrix); the NumPy ``_f``/``_w`` serve the gradient tensor and the
    input gradient.
    """

    _hyper = ("length_scale",)

    def _kind(self):
        raise NotImplementedError

    def _reads_lower_triangle(self):
        return True      # gpc._kernels.contract(symmetric=True) reads M's lower triangle

    def _gram_is_cross(self):
        return True

    def _length_scales(self, n_features):
        # the validated values (read-only), kept between changes of the attributes
        ls = next(vals for h, vals, _ in self._hyper_entries() if h == "length_scale")
        if ls.size != 1 and ls.size != n_features:
            raise ValueError(f"length_scale has {ls.size} entries (ARD) but X has "
                             f"{n_features} features")
        return ls

    def _scaled(self, X, Y):
        ls = self._length_scales(X.shape[1])
        shift = X.mean(axis=0)  # translation invariance: centring keeps |u|^2 small
        U = (X - shift) / ls
        V = None if Y is None else (Y - shift) / ls
        return ls, U, V

    def _f(self, R2):
        raise NotImplementedError

    def _w(self, R2, K):
        raise NotImplementedError

    def _free(self):
        return self._hyper_entries()[0][2] is not None

    def _call_times(self, X, Y, c):
        # c * K in the pass that makes K (a constant factor of a product)
        _, U, V = self._scaled(X, Y)
        return _gram(U, V, self._kind(), c)

    def _call(self, X, Y, eval_gradient):
        ls, U, V = self._scaled(X, Y)
        if not eval_gradient:
            return _gram(U, V, self._kind())
        R2 = _sqdist(U, V)
        K = self._f(R2)
        if not self._free():
            return K, np.empty(K.shape + (0,))
        W = self._w(R2, K)
        if ls.size == 1:
            return K, _times_weight(W, R2)[:, :, None]
        D2 = (U[:, None, :] - U[None, :, :]) ** 2
        return K, _times_weight(W[:, :, None], D2)

    def _diag(self, X):
        self._length_scales(X.shape[1])
        return np.ones(X.shape[0])

    def _contract(self, X, M, K=None, symmetric=False):
        return self._contract_value(X, M, K, symmetric=symmetric)[0] if self._free() else np.empty(0)

    def _contract_value(self, X, M, K=None, scale=1.0, symmetric=False):
        """(sum_ij M_ij dK_ij/dlog l, sum_ij M_ij K_ij) in one pass (gpc._kernels.contract).

        Given K = scale * k(X) (strict lower triangle read), the values come from it: no
        exponentials, which are most of the pass's cost."""
        ls, U, _ = self._scaled(X, None)
        ard = ls.size > 1 and self._free()
        n = U.shape[0]
        if U.shape[1] <= matrices.DIRECT_MAX_D:
            parts = over_rows(_kernels.contract_direct, n, np.ascontiguousarray(U.T), M, self._kind(),
                              ard, K, scale, symmetric)
            value, iso, g = _sum_parts(parts)
            if not self._free():
                return np.empty(0), value
            return (g if ard else np.array([iso])), value
        G, su = _gram_lower(U)
        value, iso = _sum_parts(over_rows(_kernels.contract, n, G, su, M, self._kind(), ard, K, scale,
                                          symmetric))
        if not self._free():
            return np.empty(0), value
        if not ard:
            return np.array([iso]), value
        # G is now S, S_ij = (M_ij + M_ji) W_ij / 2 (zero diagonal):
        # sum_ij M_ij W_ij (u_id - u_jd)^2 = 2 [sum_i u_id^2 (S 1)_i - sum_i u_id (S U)_id]
        # S U through scipy's BLAS (S is symmetric: its C-ordered buffer is itself in Fortran order),
        # not NumPy's, whose idle threads would spin against the next factorisation's
        SU = _dgemm(1.0, G.T, np.asfortranarray(U))
        g = 2.0 * (G.sum(axis=1) @ (U * U) - np.einsum("id,id->d", U, SU))
        return g, value

    def _scaled_by(self, X, Z):
        """(ℓ, (X - z̄)/ℓ, (Z - z̄)/ℓ): a block of rows and the inducing points, both shifted by the
        mean of Z (the same for every block) so that |u|² + |v|² - 2 uᵀv does not cancel."""
        ls = self._length_scales(X.shape[1])
        shift = Z.mean(axis=0)
        return ls, (X - shift) / ls, (Z - shift) / ls

    def _cross_gradient(self, X, Z, G, w, K=None, scale=1.0, overwrite=False):
        """The b x m contraction (:meth:`Kernel.cross_gradient`'s Notes) with W = -f'(r)/r of the
        scaled distances; the diagonal k(x, x) = 1 does not depend on θ."""
        ls, U, V = self._scaled_by(X, Z)
        R2 = _sqdist(U, V)
        if K is None:
            K = scale * self._f(R2)
        A = self._w(R2, None)
        A *= G
        if scale != 1.0:
            A *= scale
        value = float(np.vdot(G, K)) + (scale * float(np.sum(w)) if w is not None else 0.0)
        g_theta, g_Z = self._cross_parts(A, A.sum(axis=1), A.sum(axis=0), U, V, ls)
        return g_theta, g_Z, value

    def _cross_parts(self, A, rows, cols, U, V, ls):
        """(∂F/∂log ℓ, ∂F/∂Z) from A = G ∘ W with its row and column sums:
        Σ_ij A_ij (u_id - v_jd)² = rowsᵀ u_d² + colsᵀ v_d² - 2 u_dᵀ A v_d and
        ∂F/∂z_jd = [(Aᵀ U)_jd - cols_j v_jd] / ℓ_d."""
        g_Z = (A.T @ U - cols[:, None] * V) / ls
        if isinstance(self.length_scale_bounds, str):          # "fixed"
            return np.empty(0), g_Z
        per_d = rows @ (U * U) + cols @ (V * V) - 2.0 * np.einsum("id,id->d", U, A @ V)
        return (per_d if ls.size > 1 else np.array([per_d.sum()])), g_Z

    def _grad_inputs(self, X, Y, M):
        ls, U, V = self._scaled(X, Y)
        A = self._w(_sqdist(U, V), None)
        A *= M
        # G_id = -sum_j A_ij (u_id - v_jd) / l_d
        return -(U * A.sum(axis=1)[:, None] - A @ V) / ls


class RBF(_Stationary):
    r"""Squared-exponential (radial basis function) kernel.

    .. math:: k(x, y) = \exp\left(-\tfrac12 \sum_d (x_d - y_d)^2 / \ell_d^2\right)

    Parameters
    ----------
    length_scale : float or array of shape (n_features,), default 1.0
        A scalar gives the isotropic kernel; an array one length scale per feature (ARD).
    length_scale_bounds : pair of floats, array of shape (n, 2), or "fixed", default (1e-5, 1e5)

    Notes
    -----
    :math:`\partial k / \partial \log \ell_d = k \, (x_d - y_d)^2 / \ell_d^2`.
    """

    def __init__(self, length_scale=1.0, length_scale_bounds=(1e-5, 1e5)):
        self.length_scale = length_scale
        self.length_scale_bounds = length_scale_bounds
        self._validate()

    def _f(self, R2):
        K = np.multiply(R2, -0.5)
        np.exp(K, out=K)
        return K

    def _w(self, R2, K):
        return self._f(R2) if K is None else K.copy()

    def _kind(self):
        return _kernels.RBF

    def _bound_scaled(self, Z, scale, constant):
        return _SquaredExponentialBound(Z, self._length_scales(Z.shape[1]), scale, constant,
                                        not isinstance(self.length_scale_bounds, str))

    def _bound_to(self, Z):
        return self._bound_scaled(Z, 1.0, None)

    def _cross(self, X, Z, scale=1.0):
        """scale · exp(-½ |u - v|²) in the compiled pass of :class:`_SquaredExponentialBound`."""
        return self._bound_scaled(Z, scale, None).cross(X)

    def _cross_gradient(self, X, Z, G, w, K=None, scale=1.0, overwrite=False):
        """For the squared exponential W = -f'(r)/r = f, so A = G ∘ W comes from K itself: the
        compiled contraction of :class:`_SquaredExponentialBound`."""
        A = np.ascontiguousarray(G, dtype=np.float64) if overwrite else np.array(G, dtype=np.float64)
        return self._bound_scaled(Z, scale, None).gradient(X, A, w, K)


#: multiply-adds that one exponential costs, roughly: a squared exponential chunk's row of m
#: entries is about m (2d + _EXP_WORK) of them (the b x d x m products and the exponentials)
_EXP_WORK = 32


class _SquaredExponentialBound(BoundKernel):
    r"""c · exp(-½ |(x - z)/ℓ|²) bound to inducing inputs Z (R&W eq. (4.9), ARD length scales):
    RBF alone (c = 1) or a product of RBF and a constant c.

    Prepared once: ℓ (one entry per feature), the shift z̄ = mean(Z), V = (Z - z̄)/ℓ and
    |v_j|² (gpc._kernels.scaled_inputs); a chunk of rows then runs with the GIL released:
    gpc._kernels.squared_exponential_exponents and NumPy's vectorised exp for K_bu (a compiled
    scalar exp is several times slower than NumPy's SIMD one), and
    gpc._kernels.squared_exponential_gradient for the b x m contraction, whose θ part is laid
    out as the bound kernel's θ: ∂F/∂log c = F (the constant's slot, ``constant`` "first" or
    "last", None when c is fixed or absent) and ∂F/∂log ℓ (ARD: per feature, isotropic: their
    sum; none when ℓ is fixed).

    A float32 ``out`` of :meth:`cross` (and a float32 block with its G in :meth:`gradient`) runs
    the b x d x m products in single precision against a float32 copy of V (the sparse models'
    mixed precision; the compiled functions' note on precision).
    """

    nogil = True

    def __init__(self, Z, length_scale, scale=1.0, constant=None, length_scale_free=True):
        m, d = Z.shape
        n_ls = length_scale.size
        self.Z = Z
        self.scale = float(scale)
        self._log_scale = math.log(self.scale)
        self.length_scale = (np.full(d, length_scale[0]) if n_ls == 1
                             else np.ascontiguousarray(length_scale, dtype=np.float64))
        self.shift = Z.mean(axis=0)     # translation invariance: |u|², |v|² small, no cancelling
        self.V, self.vv = np.empty((m, d)), np.empty(m)
        _kernels.scaled_inputs(Z, self.shift, self.length_scale, self.V, self.vv)
        self._V32 = None
        self.row_work = m * (2 * d + _EXP_WORK)
        self._ard = n_ls > 1
        self._n_ls = n_ls if length_scale_free else 0
        self._ls_at = 1 if constant == "first" else 0
        self._const_at = None if constant is None else (0 if constant == "first" else self._n_ls)
        self._p = self._n_ls + (constant is not None)

    def gram(self):
        K = self.cross(self.Z)
        np.fill_diagonal(K, self.scale)             # k(z, z) = c exactly
        return K

    def call_gram(self):
        """c K(Z) as the kernel's own ``_call(Z)`` makes it (RBF alone, or the product's
        ``_call_times``): matrices._gram on V, which is :meth:`_Stationary._scaled`'s (Z - z̄)/ℓ to
        the bit (the same mean z̄, one subtraction and one division an entry), without scaling Z
        again."""
        return _gram(self.V, None, _kernels.RBF, self.scale)

    def _inputs_like(self, dtype):
        """V in ``dtype``: float64 itself, or its float32 copy (made once)."""
        if dtype == np.float64:
            return self.V
        if self._V32 is None:
            self._V32 = self.V.astype(np.float32)
        return self._V32

    def cross(self, X, out=None):
        X = np.ascontiguousarray(X, dtype=np.float64)
        if out is None:
            out = np.empty((X.shape[0], self.V.shape[0]))
        _kernels.squared_exponential_exponents(X, self.shift, self.length_scale,
                                               self._inputs_like(out.dtype), self.vv,
                                               self._log_scale, out)
        return np.exp(out, out=out)

    def diag(self, X):
        return np.full(X.shape[0], self.scale)

    def gradient(self, X, G, w=None, K=None):
        """(∂F/∂θ, ∂F/∂Z, F) for F = Σ G ∘ K(X, Z) + Σ w ∘ diag K(X, X); G (C-ordered) is
        scratch, ``K`` the block K(X, Z) when the caller holds it (float32 with a float32 G: the
        products in single precision; otherwise both in float64).  The diagonal k(x, x) = c
        depends on log c only (∂/∂log c = c)."""
        X = np.ascontiguousarray(X, dtype=np.float64)
        if K is None:
            K = self.cross(X)
        if K.dtype != G.dtype:
            K = K.astype(np.float64)
            G = np.ascontiguousarray(G, dtype=np.float64)
        if w is not None:
            w = np.ascontiguousarray(w, dtype=np.float64)
        per_feature, g_Z = np.empty(self.V.shape[1]), np.empty_like(self.V)
        value = _kernels.squared_exponential_gradient(
            X, self.shift, self.length_scale, self._inputs_like(K.dtype), G, K, w, self.scale,
            self._n_ls > 0, per_feature, g_Z)
        g_theta = np.empty(self._p)
        if self._n_ls:
            at = self._ls_at
            g_theta[at:at + self._n_ls] = per_feature if self._ard else per_feature.sum()
        if self._const_at is not None:
            g_theta[self._const_at] = value
        return g_theta, g_Z, value

    def cross_gradient(self, X, G, w=None, K=None):
        g_theta, g_Z, _ = self.gradient(X, G, w, K)
        return g_theta, g_Z

    def gram_gradient(self, G, K):
        # K(Z) depends on Z through both arguments and G is symmetric: twice the second's part
        g_theta, g_Z, _ = self.gradient(self.Z, G, None, K)
        g_Z *= 2.0
        return g_theta, g_Z


#: gpc._kernels' kind of the Matérn kernel of each ν
_MATERN_KINDS = {0.5: _kernels.MATERN12, 1.5: _kernels.MATERN32, 2.5: _kernels.MATERN52}


class Matern(_Stationary):
    r"""Matérn kernel with half-integer smoothness.

    With the scaled distance :math:`r = \sqrt{\sum_d (x_d - y_d)^2 / \ell_d^2}`:

    - :math:`\nu = 1/2`: :math:`k = e^{-r}`
    - :math:`\nu = 3/2`: :math:`k = (1 + \sqrt3 r) e^{-\sqrt3 r}`
    - :math:`\nu = 5/2`: :math:`k = (1 + \sqrt5 r + 5 r^2 / 3) e^{-\sqrt5 r}`

    Parameters
    ----------
    length_scale : float or array of shape (n_features,), default 1.0
    length_scale_bounds : pair of floats, array of shape (n, 2), or "fixed", default (1e-5, 1e5)
    nu : {0.5, 1.5, 2.5}, default 1.5
        Fixed, not a hyperparameter.

    Notes
    -----
    :math:`\partial k / \partial \log \ell_d = W(r) (x_d - y_d)^2 / \ell_d^2` with
    :math:`W = -k'(r)/r`: :math:`e^{-r}/r` (0 at r = 0), :math:`3 e^{-\sqrt3 r}`,
    :math:`\tfrac53 (1 + \sqrt5 r) e^{-\sqrt5 r}` respectively.  For ν = 1/2 the derivative in
    the inputs at x = y does not exist; ``gradient_inputs`` uses 0 there.
    """

    def __init__(self, length_scale=1.0, length_scale_bounds=(1e-5, 1e5), nu=1.5):
        self.length_scale = length_scale
        self.length_scale_bounds = length_scale_bounds
        self.nu = nu
        self._validate()

    def _validate(self):
        super()._validate()
        if self.nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"nu must be 0.5, 1.5 or 2.5, got {self.nu!r}")

    def _f(self, R2):
        r = np.sqrt(R2)
        if self.nu == 0.5:
            return np.exp(-r)
        if self.nu == 1.5:
            r *= np.sqrt(3.0)
            return _poly_times_exp(1.0 + r, r)
        r *= np.sqrt(5.0)
        return _poly_times_exp(1.0 + r + r * r / 3.0, r)

    def _kind(self):
        return _MATERN_KINDS[float(self.nu)]

    def _gram_is_cross(self):
        # the cross block's zero distances come out of |u|² + |v|² - 2uᵀv as rounding, ~1e-16; for
        # ν = 1/2, ∂k/∂log ℓ = r e^{-r} turns that into ~1e-8 where K(Z)'s own contraction has 0
        return self.nu != 0.5

    def _w(self, R2, K):
        r = np.sqrt(R2)
        if self.nu == 0.5:
            with np.errstate(divide="ignore", invalid="ignore"):
                W = np.exp(-r) / r
            W[r == 0] = 0.0
            return W
        if self.nu == 1.5:
            W = np.exp(-np.sqrt(3.0) * r)
            W *= 3.0
            return W
        r *= np.sqrt(5.0)
        return _poly_times_exp((5.0 / 3.0) * (1.0 + r), r)


def _times_weight(W, D2):
    """W · D2 with 0 where W = 0: at infinite distance W r² → 0, where IEEE's 0 · inf is NaN."""
    with np.errstate(invalid="ignore"):
        return np.where(W == 0.0, 0.0, W * D2)


def _poly_times_exp(poly, r):
    """poly · e^{−r}, with its limit 0 where e^{−r} = 0 (r = inf: IEEE's inf · 0 is NaN)."""
    K = np.exp(-r)
    with np.errstate(invalid="ignore"):
        K *= poly
    K[np.isnan(K) & (r == np.inf)] = 0.0
    return K


# ----------------------------------------------------------------------------------------------
# other leaf kernels
