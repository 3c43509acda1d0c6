"""Leaf kernels that are not stationary distances: constant, white noise, linear, polynomial."""

import numbers

import numpy as np

from .base import Kernel, _check_positive_values


class ConstantKernel(Kernel):
    r"""Constant kernel :math:`k(x, y) = c`.

    Parameters
    ----------
    constant_value : float, default 1.0
    constant_value_bounds : pair of floats or "fixed", default (1e-5, 1e5)

    Notes
    -----
    :math:`\partial k / \partial \log c = c`.
    """

    _hyper = ("constant_value",)

    def __init__(self, constant_value=1.0, constant_value_bounds=(1e-5, 1e5)):
        self.constant_value = constant_value
        self.constant_value_bounds = constant_value_bounds
        self._validate()

    def _validate(self):
        super()._validate()
        if np.size(self.constant_value) != 1:
            raise ValueError("constant_value must be a scalar")

    def _free(self):
        return self._hyper_entries()[0][2] is not None

    def _call(self, X, Y, eval_gradient):
        c = float(self.constant_value)
        m = X.shape[0] if Y is None else Y.shape[0]
        K = np.full((X.shape[0], m), c)
        if eval_gradient:
            return K, (K[:, :, None].copy() if self._free() else np.empty(K.shape + (0,)))
        return K

    def _diag(self, X):
        return np.full(X.shape[0], float(self.constant_value))

    def _contract(self, X, M, K=None, symmetric=False):
        return np.array([float(self.constant_value) * M.sum()]) if self._free() else np.empty(0)

    def _constant(self):
        return float(self.constant_value)

    def _gram_is_cross(self):
        return True

    def _grad_inputs(self, X, Y, M):
        return np.zeros_like(X)

    def _cross(self, X, Z, scale=1.0):
        return np.full((X.shape[0], Z.shape[0]), scale * float(self.constant_value))

    def _cross_gradient(self, X, Z, G, w, K=None, scale=1.0, overwrite=False):
        # ∂(s c)/∂log c = s c: the gradient is F itself
        value = scale * float(self.constant_value) * (float(G.sum()) + _total(w))
        return _free_part(self, value), np.zeros_like(Z), value


class WhiteKernel(Kernel):
    r"""White-noise kernel :math:`k(x_i, x_j) = \sigma^2 \delta_{ij}`.

    The noise is on the diagonal of K(X, X) only: when Y is None or ``Y is X``.  For any other Y
    (even one equal to X) K(X, Y) is zero, since distinct data are independent draws.

    Parameters
    ----------
    noise_level : float, default 1.0
        :math:`\sigma^2`.
    noise_level_bounds : pair of floats or "fixed", default (1e-5, 1e5)
    """

    _hyper = ("noise_level",)

    def __init__(self, noise_level=1.0, noise_level_bounds=(1e-5, 1e5)):
        self.noise_level = noise_level
        self.noise_level_bounds = noise_level_bounds
        self._validate()

    def _validate(self):
        super()._validate()
        if np.size(self.noise_level) != 1:
            raise ValueError("noise_level must be a scalar")

    def _free(self):
        return self._hyper_entries()[0][2] is not None

    def _call(self, X, Y, eval_gradient):
        s = float(self.noise_level)
        if Y is not None:
            return np.zeros((X.shape[0], Y.shape[0]))
        K = s * np.eye(X.shape[0])
        if eval_gradient:
            return K, (K[:, :, None].copy() if self._free() else np.empty(K.shape + (0,)))
        return K

    def _diag(self, X):
        return np.full(X.shape[0], float(self.noise_level))

    def _diagonal(self):
        return True

    def _contract(self, X, M, K=None, symmetric=False):
        return np.array([float(self.noise_level) * np.trace(M)]) if self._free() else np.empty(0)

    def _grad_inputs(self, X, Y, M):
        return np.zeros_like(X)

    def _cross(self, X, Z, scale=1.0):
        return np.zeros((X.shape[0], Z.shape[0]))     # distinct inputs: independent noise

    def _cross_gradient(self, X, Z, G, w, K=None, scale=1.0, overwrite=False):
        value = scale * float(self.noise_level) * _total(w)     # the diagonal terms only
        return _free_part(self, value), np.zeros_like(Z), value


class Linear(Kernel):
    r"""Linear kernel :math:`k(x, y) = v \, x^\top y`.

    Parameters
    ----------
    variance : float, default 1.0
        :math:`v`.
    variance_bounds : pair of floats or "fixed", default (1e-5, 1e5)

    Notes
    -----
    :math:`\partial k / \partial \log v = k`; :math:`\partial k / \partial x_d = v \, y_d`.
    Equals scikit-learn's ``ConstantKernel(v) * DotProduct(sigma_0=0)``.
    """

    _hyper = ("variance",)

    def __init__(self, variance=1.0, variance_bounds=(1e-5, 1e5)):
        self.variance = variance
        self.variance_bounds = variance_bounds
        self._validate()

    def _validate(self):
        super()._validate()
        if np.size(self.variance) != 1:
            raise ValueError("variance must be a scalar")

    def _free(self):
        return self._hyper_entries()[0][2] is not None

    def _call(self, X, Y, eval_gradient):
        v = float(self.variance)
        K = X @ (X if Y is None else Y).T
        K *= v
        if Y is None:
            K += K.T
            K *= 0.5
        _check_no_overflow(self, K, X, Y)
        if eval_gradient:
            return K, (K[:, :, None].copy() if self._free() else np.empty(K.shape + (0,)))
        return K

    def _diag(self, X):
        return _check_no_overflow(self, float(self.variance) * np.einsum("ij,ij->i", X, X), X)

    def _contract(self, X, M, K=None, symmetric=False):
        if not self._free():
            return np.empty(0)
        # sum_ij M_ij v x_i.x_j = v sum(X o (M X)): O(n^2 d), no n x n temporary
        return np.array([float(self.variance) * np.vdot(X, M @ X)])

    def _grad_inputs(self, X, Y, M):
        return float(self.variance) * (M @ Y)

    def _cross_gradient(self, X, Z, G, w, K=None, scale=1.0, overwrite=False):
        # ∂k/∂log v = k; ∂(v xᵀz)/∂z = v x
        v = scale * float(self.variance)
        if K is None:
            K = self._cross(X, Z, scale)
        value = float(np.vdot(G, K))
        if w is not None:
            value += v * float(w @ np.einsum("ij,ij->i", X, X))
        return _free_part(self, value), v * (G.T @ X), value

    def is_stationary(self):
        return False


def _check_no_overflow(kernel, values, X, Y=None):
    """``values`` if finite; else a ValueError naming the kernel and the input size that overflows.

    The Linear and Polynomial kernels grow with |x|: inputs of size ~1e155 (Linear) give values
    beyond float64, and a predictive variance inf − inf would be NaN further on."""
    if np.all(np.isfinite(values)):
        return values
    biggest = max(float(np.max(np.abs(X))), 0.0 if Y is None else float(np.max(np.abs(Y))))
    raise ValueError(f"{type(kernel).__name__} kernel values overflow float64 for inputs as large as "
                     f"{biggest:.3g}; rescale the inputs (e.g. standardise them)")


class Polynomial(Kernel):
    r"""Polynomial kernel :math:`k(x, y) = (1 + x^\top y / s)^p`.

    With ``scale=None`` the scale is s = n_features, the mean-field paper's
    :math:`(1 + x^\top x' / m)^k`.  Neither the degree p nor the scale s is a hyperparameter:
    this kernel has an empty ``theta``.  Multiply by a :class:`ConstantKernel` for an amplitude.

    Parameters
    ----------
    degree : int >= 1, default 2
    scale : float > 0 or None, default None

    Notes
    -----
    :math:`\partial k / \partial x_d = p (1 + x^\top y / s)^{p-1} y_d / s`.
    """

    def __init__(self, degree=2, scale=None):
        self.degree = degree
        self.scale = scale
        self._validate()

    def _validate(self):
        d = self.degree
        if not isinstance(d, numbers.Integral) or isinstance(d, bool) or d < 1:
            raise ValueError(f"degree must be an integer >= 1, got {d!r}")
        if self.scale is not None:
            _check_positive_values(self.scale, "scale")
            if np.size(self.scale) != 1:
                raise ValueError("scale must be a scalar or None")

    def _s(self, X):
        return float(X.shape[1]) if self.scale is None else float(self.scale)

    def _base(self, X, Y):
        B = X @ (X if Y is None else Y).T
        B /= self._s(X)
        B += 1.0
        if Y is None:
            B += B.T
            B *= 0.5
        return B

    def _call(self, X, Y, eval_gradient):
        with np.errstate(over="ignore", invalid="ignore"):
            K = self._base(X, Y) ** int(self.degree)
        _check_no_overflow(self, K, X, Y)
        if eval_gradient:
            return K, np.empty(K.shape + (0,))
        return K

    def _diag(self, X):
        with np.errstate(over="ignore"):
            d = (1.0 + np.einsum("ij,ij->i", X, X) / self._s(X)) ** int(self.degree)
        return _check_no_overflow(self, d, X)

    def _contract(self, X, M, K=None, symmetric=False):
        return np.empty(0)

    def _grad_inputs(self, X, Y, M):
        p = int(self.degree)
        B = self._base(X, Y)
        A = B ** (p - 1) if p > 1 else np.ones_like(B)
        A *= M
        return (p / self._s(X)) * (A @ Y)

    def _cross_gradient(self, X, Z, G, w, K=None, scale=1.0, overwrite=False):
        # no θ; ∂k(x, z)/∂z = p (1 + xᵀz/s)^(p-1) x / s
        if K is None:
            K = self._cross(X, Z, scale)
        value = float(np.vdot(G, K)) + (scale * float(w @ self._diag(X)) if w is not None else 0.0)
        g_Z = scale * self._grad_inputs(Z, X, np.ascontiguousarray(G.T))
        return np.empty(0), g_Z, value

    def is_stationary(self):
        return False


def _total(w):
    return 0.0 if w is None else float(np.sum(w))


def _free_part(kernel, value):
    """[value] when the kernel's one hyperparameter is free (its gradient in log space is the
    function's value), else nothing."""
    return np.array([value]) if kernel._free() else np.empty(0)
