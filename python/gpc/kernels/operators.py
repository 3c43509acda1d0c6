"""Kernels made of kernels: sums, products and powers (scikit-learn's Exponentiation)."""


import numpy as np

from .base import Kernel, _is_kernel_like, _shallow_copy
from .simple import WhiteKernel
from .sklearn import as_kernel


class _Binary(Kernel):
    def __init__(self, k1, k2):
        self.k1 = k1
        self.k2 = k2
        self._validate()

    def _validate(self):
        for name in ("k1", "k2"):
            if not _is_kernel_like(getattr(self, name)):
                raise ValueError(f"{name} must be a kernel, got {getattr(self, name)!r}")

    @property
    def _a(self):
        k = self.k1
        return k if isinstance(k, Kernel) else as_kernel(k)

    @property
    def _b(self):
        k = self.k2
        return k if isinstance(k, Kernel) else as_kernel(k)

    @property
    def theta(self):
        return np.concatenate([self._a.theta, self._b.theta])

    @theta.setter
    def theta(self, theta):
        theta = self._check_theta(theta)
        p = self._a.n_dims
        self.k1.theta = theta[:p]
        self.k2.theta = theta[p:]

    @property
    def bounds(self):
        return np.vstack([np.reshape(self._a.bounds, (-1, 2)), np.reshape(self._b.bounds, (-1, 2))])

    @property
    def hyperparameter_names(self):
        return ([f"k1__{n}" for n in self._a.hyperparameter_names]
                + [f"k2__{n}" for n in self._b.hyperparameter_names])

    def is_stationary(self):
        return self._a.is_stationary() and self._b.is_stationary()

    def _n_free(self):
        return self._a._n_free() + self._b._n_free()

    def _has_grad_inputs(self):
        return self._a._has_grad_inputs() and self._b._has_grad_inputs()

    def _gram_is_cross(self):
        return self._a._gram_is_cross() and self._b._gram_is_cross()

    def _with_theta(self, theta):
        new = _shallow_copy(self)
        p = self._a._n_free()
        new.k1, new.k2 = _part_with_theta(self.k1, theta[:p]), _part_with_theta(self.k2, theta[p:])
        return new


def _part_with_theta(kernel, theta):
    """A term or factor at its share of θ (a scikit-learn kernel through its own clone)."""
    return kernel._with_theta(theta) if isinstance(kernel, Kernel) else kernel.clone_with_theta(theta)


def _joined(g_a, g_b):
    """Two parts' gradients in Z added; None when either part has none."""
    return None if g_a is None or g_b is None else g_a + g_b


class Sum(_Binary):
    r"""Sum of two kernels, :math:`k = k_1 + k_2`; ``theta`` is ``k1.theta`` then ``k2.theta``.

    Parameters
    ----------
    k1, k2 : Kernel
        The two terms (``k1 + k2`` builds the same).
    """

    def _call(self, X, Y, eval_gradient):
        a, b = self._a, self._b
        if not eval_gradient:
            return a(X, Y) + b(X, Y)
        K1, G1 = a(X, eval_gradient=True)
        K2, G2 = b(X, eval_gradient=True)
        return K1 + K2, np.concatenate([G1, G2], axis=2)

    def _diag(self, X):
        return self._a._diag(X) + self._b._diag(X)

    def _contract(self, X, M, K=None, symmetric=False):
        a, b = self._a, self._b
        Ka = K if K is not None and b._diagonal() else None
        Kb = K if K is not None and a._diagonal() else None
        return np.concatenate([a._contract(X, M, K=Ka, symmetric=symmetric),
                               b._contract(X, M, K=Kb, symmetric=symmetric)])

    def _grad_inputs(self, X, Y, M):
        return self._a.gradient_inputs(X, Y, M) + self._b.gradient_inputs(X, Y, M)

    def _cross(self, X, Z, scale=1.0):
        K = self._a._cross(X, Z, scale)
        K += self._b._cross(X, Z, scale)
        return K

    def _cross_gradient(self, X, Z, G, w, K=None, scale=1.0, overwrite=False):
        # white noise is zero between distinct inputs: the other term's K is then the sum's
        a, b = self._a, self._b
        Ka = K if K is not None and b._diagonal() else None
        Kb = K if K is not None and a._diagonal() else None
        g_a, z_a, v_a = a._cross_gradient(X, Z, G, w, Ka, scale)
        g_b, z_b, v_b = b._cross_gradient(X, Z, G, w, Kb, scale, overwrite)
        return np.concatenate([g_a, g_b]), _joined(z_a, z_b), v_a + v_b

    def _gram_gradient(self, Z, G, K):
        # k + D with D diagonal (white noise) and K_k(Z) the cross block K_k(Z, Z): one cross
        # contraction of k against K less D gives θ_k and Z (twice the second argument's part, G
        # being symmetric), D's own contraction its θ
        a, b = self._a, self._b
        if a._diagonal() == b._diagonal():
            return super()._gram_gradient(Z, G, K)
        noise, other = (a, b) if a._diagonal() else (b, a)
        if not other._gram_is_cross():
            return super()._gram_gradient(Z, G, K)
        g_noise = noise._contract(Z, G)
        K_other = np.array(K, dtype=np.float64, order="C")
        K_other.flat[:: K_other.shape[0] + 1] -= noise._diag(Z)
        g_other, g_Z, _ = other._cross_gradient(Z, Z, G, None, K_other, overwrite=True)
        g_theta = np.concatenate([g_noise, g_other] if noise is a else [g_other, g_noise])
        return g_theta, None if g_Z is None else 2.0 * g_Z

    def _noise_split(self, Z):
        # k + white noise where k has a compiled bound: (k's bound, the noise kernel, its side)
        a, b = self._a, self._b
        if a._diagonal() == b._diagonal():
            return None
        noise, other = (a, b) if a._diagonal() else (b, a)
        if not isinstance(noise, WhiteKernel):
            return None
        inner = other._bound_to(Z)
        return (inner, noise, noise is a, other) if inner.nogil else None

    def __repr__(self):
        return f"{self.k1!r} + {self.k2!r}"



class Product(_Binary):
    r"""Product of two kernels, :math:`k = k_1 k_2`; ``theta`` is ``k1.theta`` then ``k2.theta``.

    :math:`\sum_{ij} M_{ij} \partial (K_1 \circ K_2)_{ij} / \partial\theta_1
    = \sum_{ij} (M \circ K_2)_{ij} \partial K_{1,ij} / \partial\theta_1`, and likewise for
    :math:`\theta_2` and for the inputs.

    Parameters
    ----------
    k1, k2 : Kernel
        The two factors (``k1 * k2`` builds the same).
    """

    def _reads_lower_triangle(self):
        # c k contracts as k does (the constant scales); a product of two kernels reads M o K_2
        ca, cb = self._a._constant(), self._b._constant()
        if (ca is None) == (cb is None):
            return False
        return (self._b if ca is not None else self._a)._reads_lower_triangle()

    def _call(self, X, Y, eval_gradient):
        a, b = self._a, self._b
        if not eval_gradient:
            ca, cb = a._constant(), b._constant()
            if ca is not None or cb is not None:   # a constant factor scales, no n x n of it
                return b._call_times(X, Y, ca) if ca is not None else a._call_times(X, Y, cb)
            K = a(X, Y)
            K *= b(X, Y)
            return K
        K1, G1 = a(X, eval_gradient=True)
        K2, G2 = b(X, eval_gradient=True)
        return K1 * K2, np.concatenate([G1 * K2[:, :, None], G2 * K1[:, :, None]], axis=2)

    def _diag(self, X):
        return self._a._diag(X) * self._b._diag(X)

    def _scaled_factor(self):
        """(c, constant factor, other factor, whether the constant is k1) when exactly one factor
        is a constant c, else None: c · k, whose passes are k's own at scale c."""
        a, b = self._a, self._b
        ca, cb = a._constant(), b._constant()
        if (ca is None) == (cb is None):
            return None
        return (ca, a, b, True) if ca is not None else (cb, b, a, False)

    def _contract(self, X, M, K=None, symmetric=False):
        # each factor's own K is computed once and handed to its contraction (an RBF then reuses it
        # instead of recomputing distances and exponentials); a constant factor scales M instead of
        # being expanded into an n x n matrix
        scaled = self._scaled_factor()
        if scaled is not None:
            # c * k: d/dlog c = c sum M o K_k and d/dtheta_k = c sum M o dK_k, both from one pass of k
            c, const, other, first = scaled
            g_other, value = other._contract_value(X, M, K, c, symmetric)
            g_const = np.array([c * value]) if const.n_dims else np.empty(0)
            parts = (g_const, c * np.asarray(g_other)) if first else (c * np.asarray(g_other), g_const)
            return np.concatenate(parts)
        a, b = self._a, self._b
        ca, cb = a._constant(), b._constant()
        Ka = None if ca is not None else a(X)
        Kb = None if cb is not None else b(X)
        parts = []
        if a.n_dims:
            parts.append(a._contract(X, M * (cb if Kb is None else Kb), K=Ka, symmetric=symmetric))
        if b.n_dims:
            parts.append(b._contract(X, M * (ca if Ka is None else Ka), K=Kb, symmetric=symmetric))
        return np.concatenate(parts) if parts else np.empty(0)

    def _bound_to(self, Z):
        # c · k with a compiled bound k: one bound object at scale c, log c's slot in θ kept
        scaled = self._scaled_factor()
        if scaled is not None:
            c, const, other, first = scaled
            slot = ("first" if first else "last") if const._n_free() else None
            bound = other._bound_scaled(Z, c, slot)
            if bound is not None:
                return bound
        return super()._bound_to(Z)

    def _cross(self, X, Z, scale=1.0):
        a, b = self._a, self._b
        ca, cb = a._constant(), b._constant()
        if ca is not None:                  # a constant factor scales, no b x m of it
            return b._cross(X, Z, scale * ca)
        if cb is not None:
            return a._cross(X, Z, scale * cb)
        K = a._cross(X, Z, scale)
        K *= b._cross(X, Z)
        return K

    def _cross_gradient(self, X, Z, G, w, K=None, scale=1.0, overwrite=False):
        # F = s Σ G ∘ K_a ∘ K_b + s Σ w ∘ d_a ∘ d_b: each factor sees G ∘ K_other and w ∘ d_other;
        # c · k: k's own pass at scale s c gives ∂F/∂log c = F as well
        scaled = self._scaled_factor()
        if scaled is not None:
            c, const, other, first = scaled
            g_other, g_Z, value = other._cross_gradient(X, Z, G, w, K, scale * c, overwrite)
            g_const = np.array([value]) if const._n_free() else np.empty(0)
            parts = (g_const, g_other) if first else (g_other, g_const)
            return np.concatenate(parts), g_Z, value
        a, b = self._a, self._b
        Ka, Kb = a._cross(X, Z), b._cross(X, Z)
        wa = None if w is None else w * b._diag(X)
        wb = None if w is None else w * a._diag(X)
        g_a, z_a, value = a._cross_gradient(X, Z, G * Kb, wa, scale * Ka, scale)
        g_b, z_b, _ = b._cross_gradient(X, Z, G * Ka, wb, scale * Kb, scale, True)
        return np.concatenate([g_a, g_b]), _joined(z_a, z_b), value

    def _grad_inputs(self, X, Y, M):
        a, b = self._a, self._b
        MK = b(X, Y)
        MK *= M
        G = a.gradient_inputs(X, Y, MK)
        MK = a(X, Y)
        MK *= M
        G += b.gradient_inputs(X, Y, MK)
        return G

    def __repr__(self):
        return f"{self.k1!r} * {self.k2!r}"


# ----------------------------------------------------------------------------------------------


class _Power(Kernel):
    r"""scikit-learn's Exponentiation, :math:`k = b^p` with the base's θ:
    :math:`\sum_{ij} M_{ij} \partial k_{ij} = \sum_{ij} (M \circ p\, b^{p-1})_{ij} \partial b_{ij}`."""

    def __init__(self, base, exponent):
        self.base = base
        self.exponent = float(exponent)

    @property
    def theta(self):
        return self.base.theta

    @theta.setter
    def theta(self, theta):
        self.base.theta = theta

    @property
    def bounds(self):
        return self.base.bounds

    def _call(self, X, Y, eval_gradient):
        p = self.exponent
        if not eval_gradient:
            return self.base._call(X, Y, False) ** p
        Kb, Gb = self.base._call(X, None, True)
        return Kb ** p, (p * Kb ** (p - 1))[:, :, None] * Gb

    def _diag(self, X):
        return self.base._diag(X) ** self.exponent

    def _contract(self, X, M, K=None, symmetric=False):
        Kb = self.base._call(X, None, False)
        return self.base._contract(X, M * (self.exponent * Kb ** (self.exponent - 1)), K=Kb,
                                   symmetric=symmetric)

    def is_stationary(self):
        return self.base.is_stationary()
