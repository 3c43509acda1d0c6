"""Covariance functions with log-space hyperparameters, their θ-gradients as a contraction, and
their input gradients.

The interface follows scikit-learn's kernels (``theta``, ``bounds``, ``__call__(X, Y=None,
eval_gradient=False)``, ``diag``, ``clone_with_theta``, ``get_params``), so either kind can be given
to the estimator; :func:`as_kernel` adapts a scikit-learn kernel.  What gpc's own code uses is

    gradient_contract(X, M)[k] = Σ_ij M_ij ∂K_ij/∂θ_k        (θ = log hyperparameters)

which never forms the n × n × p tensor, and ``gradient_inputs(X, Y, M)`` for inducing inputs.

Kernels (r² = Σ_d (x_d − x'_d)²/ℓ_d², scalar ℓ or one per dimension):

- ``RBF(ℓ)``:            exp(−r²/2)
- ``Matern(ℓ, ν)``:      ν = 1.5: (1 + √3 r) e^{−√3 r};  ν = 2.5: (1 + √5 r + 5r²/3) e^{−√5 r}
- ``ConstantKernel(c)``: c
- ``WhiteKernel(σ²)``:   σ² δ(x, x') (only on the diagonal of K(X, X); the PL paper's σ₂² δ)
- ``Linear(v)``:         v x·x'
- ``Polynomial(k, s)``:  (1 + x·x'/s)^k with s = number of features by default (MF paper); no
                         hyperparameter (k and s are fixed)
- sums and products, also written ``k1 + k2``, ``k1 * k2``, ``2.0 * k``.
"""

import copy
import inspect

import numpy as np


def _as_2d(X, name):
    if hasattr(X, "toarray"):
        raise TypeError(f"{name} is sparse; kernels need dense arrays")
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-dimensional (n_samples, n_features), got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{name} contains NaN or inf")
    return X


def _check_XY(X, Y):
    X = _as_2d(X, "X")
    if Y is None:
        return X, None
    Y = _as_2d(Y, "Y")
    if Y.shape[1] != X.shape[1]:
        raise ValueError(f"X has {X.shape[1]} features but Y has {Y.shape[1]}")
    return X, Y


def _positive(value, name):
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim > 1 or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return arr


def _bounds(bounds, name, size):
    if isinstance(bounds, str):
        if bounds != "fixed":
            raise ValueError(f"{name}_bounds must be a (low, high) pair or 'fixed', got {bounds!r}")
        return None
    b = np.asarray(bounds, dtype=np.float64)
    if b.shape == (2,):
        b = np.tile(b, (size, 1))
    if b.shape != (size, 2) or np.any(~(b > 0)) or np.any(np.isnan(b)) or np.any(b[:, 0] > b[:, 1]):
        raise ValueError(f"{name}_bounds must be positive (low, high) pairs with low <= high, got {bounds!r}")
    return b


def _sqdist(X, Y, scale):
    """Σ_d (x_d − y_d)²/scale_d² via ‖x‖² + ‖y‖² − 2 x·y, clipped at 0 (rounding)."""
    Xs = X / scale
    Ys = Xs if Y is None else Y / scale
    xx = np.einsum("ij,ij->i", Xs, Xs)
    yy = xx if Y is None else np.einsum("ij,ij->i", Ys, Ys)
    D = Xs @ Ys.T
    D *= -2.0
    D += xx[:, None]
    D += yy[None, :]
    np.maximum(D, 0.0, out=D)
    if Y is None:
        D.flat[:: D.shape[0] + 1] = 0.0
    return D


def _weighted_sqdist_contract(A, X, Y, scale):
    """For each d: Σ_ij A_ij (x_id − y_jd)²/scale_d², without forming per-dimension matrices."""
    Y = X if Y is None else Y
    r, c = A.sum(axis=1), A.sum(axis=0)
    out = (X**2).T @ r + (Y**2).T @ c - 2.0 * np.einsum("id,id->d", X, A @ Y)
    return out / scale**2


class Kernel:
    """Base class.  Subclasses list their positive hyperparameters in ``_hyper`` and implement
    ``_K(X, Y)``, ``_dK(X)`` (list of n × n matrices ∂K/∂θ_k for the free ones), ``diag`` and, for
    speed, ``_contract(X, M)``."""

    _hyper = ()
    requires_vector_input = True

    # -- parameters ------------------------------------------------------------------------------
    @classmethod
    def _param_names(cls):
        sig = inspect.signature(cls.__init__)
        return [p for p in sig.parameters if p != "self"]

    def get_params(self, deep=True):
        params = {name: getattr(self, name) for name in self._param_names()}
        if deep:
            for name, value in list(params.items()):
                if isinstance(value, Kernel):
                    params.update((f"{name}__{k}", v) for k, v in value.get_params().items())
        return params

    def set_params(self, **params):
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in self._param_names():
                raise ValueError(f"invalid parameter {name!r} for kernel {type(self).__name__}")
            if sub:
                getattr(self, name).set_params(**{sub: value})
            else:
                setattr(self, name, value)
        self._validate()
        return self

    def _validate(self):
        for h in self._hyper:
            value = _positive(getattr(self, h), h)
            _bounds(getattr(self, h + "_bounds"), h, value.size)

    def _free(self):
        """[(name, value array, log-bounds)] of the hyperparameters that are not fixed."""
        out = []
        for h in self._hyper:
            value = np.atleast_1d(_positive(getattr(self, h), h))
            b = _bounds(getattr(self, h + "_bounds"), h, value.size)
            if b is not None:
                out.append((h, value, np.log(b)))
        return out

    @property
    def hyperparameter_names(self):
        return [f"{h}[{i}]" if v.size > 1 else h for h, v, _ in self._free() for i in range(v.size)]

    @property
    def n_dims(self):
        return len(self.theta)

    @property
    def theta(self):
        free = self._free()
        return np.concatenate([np.log(v) for _, v, _ in free]) if free else np.empty(0)

    @theta.setter
    def theta(self, theta):
        theta = np.asarray(theta, dtype=np.float64).ravel()
        if theta.shape != (self.n_dims,):
            raise ValueError(f"theta must have {self.n_dims} entries, got {theta.shape[0]}")
        if not np.all(np.isfinite(theta)):
            raise ValueError("theta contains NaN or inf")
        i = 0
        for h, v, _ in self._free():
            vals = np.exp(theta[i:i + v.size])
            scalar = np.ndim(getattr(self, h)) == 0
            setattr(self, h, float(vals[0]) if scalar else vals)
            i += v.size

    @property
    def bounds(self):
        free = self._free()
        return np.vstack([b for _, _, b in free]) if free else np.empty((0, 2))

    def clone_with_theta(self, theta):
        clone = copy.deepcopy(self)
        clone.theta = theta
        return clone

    # -- evaluation ------------------------------------------------------------------------------
    def __call__(self, X, Y=None, eval_gradient=False):
        """K(X, Y); with ``eval_gradient`` (Y must be None) also the tensor ∂K/∂θ of shape (n, n, p)
        as scikit-learn returns it (compatibility only: gpc uses ``gradient_contract``)."""
        X, Y = _check_XY(X, Y)
        K = self._K(X, Y)
        if not eval_gradient:
            return K
        if Y is not None:
            raise ValueError("the gradient can only be evaluated when Y is None")
        dK = self._dK(X)
        return K, (np.stack(dK, axis=2) if dK else np.empty(K.shape + (0,)))

    def gradient_contract(self, X, M):
        """Σ_ij M_ij ∂K(X, X)_ij/∂θ_k for every free log-hyperparameter θ_k."""
        X = _as_2d(X, "X")
        M = np.asarray(M, dtype=np.float64)
        if M.shape != (X.shape[0], X.shape[0]):
            raise ValueError(f"M must be {X.shape[0]}x{X.shape[0]}, got {M.shape}")
        return np.asarray(self._contract(X, M), dtype=np.float64)

    def _contract(self, X, M, K=None):
        """Σ_ij M_ij ∂K_ij/∂θ_k; ``K``, when the caller has it, is this kernel's own K(X, X)."""
        return np.array([np.vdot(M, d) for d in self._dK(X)])

    def _constant(self):
        """The value c if this kernel is a constant c (products then scale instead of multiplying)."""
        return None

    def gradient_inputs(self, X, Y, M):
        """G[i, d] = Σ_j M_ij ∂k(x_i, y_j)/∂x_id (Y None means Y = X, the second argument held fixed)."""
        X, Y = _check_XY(X, Y)
        Yf = X if Y is None else Y
        M = np.asarray(M, dtype=np.float64)
        if M.shape != (X.shape[0], Yf.shape[0]):
            raise ValueError(f"M must be {X.shape[0]}x{Yf.shape[0]}, got {M.shape}")
        return self._grad_inputs(X, Yf, M)

    def _grad_inputs(self, X, Y, M):
        raise NotImplementedError(f"{type(self).__name__} has no input gradient")

    def diag(self, X):
        return np.diag(self(X)).copy()

    def is_stationary(self):
        return True

    # -- algebra and the rest --------------------------------------------------------------------
    def __add__(self, other):
        return Sum(self, other if isinstance(other, Kernel) else ConstantKernel(other))

    def __radd__(self, other):
        return Sum(other if isinstance(other, Kernel) else ConstantKernel(other), self)

    def __mul__(self, other):
        return Product(self, other if isinstance(other, Kernel) else ConstantKernel(other))

    def __rmul__(self, other):
        return Product(other if isinstance(other, Kernel) else ConstantKernel(other), self)

    def __eq__(self, other):
        if type(self) is not type(other):
            return False
        a, b = self.get_params(), other.get_params()
        return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k], dtype=object), np.asarray(b[k], dtype=object))
                                            if not isinstance(a[k], Kernel) else a[k] == b[k] for k in a)

    __hash__ = None

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params(deep=False).items())
        return f"{type(self).__name__}({args})"


class _Stationary(Kernel):
    """Shared by RBF and Matern: k = κ(r), r² = Σ_d (x_d − x'_d)²/ℓ_d²."""

    _hyper = ("length_scale",)

    def __init__(self, length_scale=1.0, length_scale_bounds=(1e-5, 1e5)):
        self.length_scale = length_scale
        self.length_scale_bounds = length_scale_bounds
        self._validate()

    @property
    def anisotropic(self):
        return np.ndim(self.length_scale) > 0 and np.size(self.length_scale) > 1

    def _scale(self, X):
        ell = np.atleast_1d(np.asarray(self.length_scale, dtype=np.float64))
        if ell.size > 1 and ell.size != X.shape[1]:
            raise ValueError(f"length_scale has {ell.size} entries but X has {X.shape[1]} features")
        return ell

    def _K(self, X, Y):
        return self._kappa(_sqdist(X, Y, self._scale(X)))

    def diag(self, X):
        X = _as_2d(X, "X")
        return np.full(X.shape[0], self._kappa(np.zeros(1))[0])

    def _g(self, D2):
        """g(r) = −κ'(r)/r, so that ∂k/∂log ℓ_d = g (Δ_d/ℓ_d)² and ∂k/∂x_d = −g Δ_d/ℓ_d²."""
        raise NotImplementedError

    def _free_length(self):
        return _bounds(self.length_scale_bounds, "length_scale", np.size(self.length_scale)) is not None

    def _dK(self, X):
        if not self._free_length():
            return []
        ell = self._scale(X)
        G = self._g(_sqdist(X, None, ell))
        if not self.anisotropic:
            return [G * _sqdist(X, None, ell)]
        return [G * ((X[:, d:d + 1] - X[:, d:d + 1].T) / ell[d]) ** 2 for d in range(X.shape[1])]

    _g_is_kappa = False

    def _contract(self, X, M, K=None):
        if not self._free_length():
            return np.empty(0)
        ell = self._scale(X)
        G = K if (K is not None and self._g_is_kappa) else self._g(_sqdist(X, None, ell))
        A = M * G
        per_dim = _weighted_sqdist_contract(A, X, None, ell if ell.size > 1 else np.full(X.shape[1], ell[0]))
        return per_dim if self.anisotropic else np.array([per_dim.sum()])

    def _grad_inputs(self, X, Y, M):
        ell = self._scale(X)
        A = M * self._g(_sqdist(X, Y, ell))
        return -(A.sum(axis=1)[:, None] * X - A @ Y) / ell**2


class RBF(_Stationary):
    """Squared exponential k(x, x') = exp(−½ Σ_d (x_d − x'_d)²/ℓ_d²); scalar ℓ or one per feature (ARD)."""

    def _kappa(self, D2):
        return np.exp(-0.5 * D2)

    def _g(self, D2):
        return np.exp(-0.5 * D2)

    _g_is_kappa = True   # for the squared exponential −κ'(r)/r = κ(r): the contraction reuses K


class Matern(_Stationary):
    """Matérn k = (1 + √3 r) e^{−√3 r} (ν = 1.5) or (1 + √5 r + 5r²/3) e^{−√5 r} (ν = 2.5)."""

    def __init__(self, length_scale=1.0, length_scale_bounds=(1e-5, 1e5), nu=1.5):
        if nu not in (1.5, 2.5):
            raise ValueError(f"nu must be 1.5 or 2.5, got {nu!r}")
        self.nu = nu
        super().__init__(length_scale, length_scale_bounds)

    def _kappa(self, D2):
        r = np.sqrt(D2)
        if self.nu == 1.5:
            s = np.sqrt(3.0) * r
            return (1.0 + s) * np.exp(-s)
        s = np.sqrt(5.0) * r
        return (1.0 + s + s * s / 3.0) * np.exp(-s)

    def _g(self, D2):
        r = np.sqrt(D2)
        if self.nu == 1.5:
            return 3.0 * np.exp(-np.sqrt(3.0) * r)
        s = np.sqrt(5.0) * r
        return (5.0 / 3.0) * (1.0 + s) * np.exp(-s)


class ConstantKernel(Kernel):
    """k(x, x') = c."""

    _hyper = ("constant_value",)

    def __init__(self, constant_value=1.0, constant_value_bounds=(1e-5, 1e5)):
        self.constant_value = constant_value
        self.constant_value_bounds = constant_value_bounds
        self._validate()

    def _K(self, X, Y):
        return np.full((X.shape[0], X.shape[0] if Y is None else Y.shape[0]), float(self.constant_value))

    def diag(self, X):
        return np.full(_as_2d(X, "X").shape[0], float(self.constant_value))

    def _dK(self, X):
        return [self._K(X, None)] if self._free() else []

    def _contract(self, X, M, K=None):
        return np.array([float(self.constant_value) * M.sum()]) if self._free() else np.empty(0)

    def _constant(self):
        return float(self.constant_value)

    def _grad_inputs(self, X, Y, M):
        return np.zeros_like(X)


class WhiteKernel(Kernel):
    """k(x, x') = σ² δ(x, x'): σ² on the diagonal of K(X, X), zero between different sets."""

    _hyper = ("noise_level",)

    def __init__(self, noise_level=1.0, noise_level_bounds=(1e-5, 1e5)):
        self.noise_level = noise_level
        self.noise_level_bounds = noise_level_bounds
        self._validate()

    def _K(self, X, Y):
        if Y is None:
            return float(self.noise_level) * np.eye(X.shape[0])
        return np.zeros((X.shape[0], Y.shape[0]))

    def diag(self, X):
        return np.full(_as_2d(X, "X").shape[0], float(self.noise_level))

    def _dK(self, X):
        return [self._K(X, None)] if self._free() else []

    def _contract(self, X, M, K=None):
        return np.array([float(self.noise_level) * np.trace(M)]) if self._free() else np.empty(0)

    def _grad_inputs(self, X, Y, M):
        return np.zeros_like(X)


class Linear(Kernel):
    """k(x, x') = v x·x'."""

    _hyper = ("variance",)

    def __init__(self, variance=1.0, variance_bounds=(1e-5, 1e5)):
        self.variance = variance
        self.variance_bounds = variance_bounds
        self._validate()

    def _K(self, X, Y):
        return float(self.variance) * (X @ (X if Y is None else Y).T)

    def diag(self, X):
        X = _as_2d(X, "X")
        return float(self.variance) * np.einsum("ij,ij->i", X, X)

    def _dK(self, X):
        return [self._K(X, None)] if self._free() else []

    def _contract(self, X, M, K=None):
        return np.array([float(self.variance) * np.einsum("id,id->", X, M @ X)]) if self._free() else np.empty(0)

    def _grad_inputs(self, X, Y, M):
        return float(self.variance) * (M @ Y)

    def is_stationary(self):
        return False


class Polynomial(Kernel):
    """k(x, x') = (1 + x·x'/s)^k, s = n_features when ``scale`` is None (MF paper, Figure 2).

    Both the degree k and the scale s are fixed: the kernel has no hyperparameter in θ.
    """

    def __init__(self, degree=2, scale=None):
        if not isinstance(degree, (int, np.integer)) or degree < 1:
            raise ValueError(f"degree must be a positive integer, got {degree!r}")
        if scale is not None:
            _positive(scale, "scale")
        self.degree = degree
        self.scale = scale

    def _validate(self):
        pass

    def _s(self, X):
        return float(X.shape[1] if self.scale is None else self.scale)

    def _K(self, X, Y):
        return (1.0 + X @ (X if Y is None else Y).T / self._s(X)) ** self.degree

    def diag(self, X):
        X = _as_2d(X, "X")
        return (1.0 + np.einsum("ij,ij->i", X, X) / self._s(X)) ** self.degree

    def _dK(self, X):
        return []

    def _grad_inputs(self, X, Y, M):
        s = self._s(X)
        P = self.degree * (1.0 + X @ Y.T / s) ** (self.degree - 1) / s
        return (M * P) @ Y

    def is_stationary(self):
        return False


class _Binary(Kernel):
    def __init__(self, k1, k2):
        self.k1 = k1
        self.k2 = k2

    def _validate(self):
        self.k1._validate()
        self.k2._validate()

    @property
    def theta(self):
        return np.concatenate([self.k1.theta, self.k2.theta])

    @theta.setter
    def theta(self, theta):
        theta = np.asarray(theta, dtype=np.float64).ravel()
        if theta.shape != (self.n_dims,):
            raise ValueError(f"theta must have {self.n_dims} entries, got {theta.shape[0]}")
        p = self.k1.n_dims
        self.k1.theta = theta[:p]
        self.k2.theta = theta[p:]

    @property
    def n_dims(self):
        return self.k1.n_dims + self.k2.n_dims

    @property
    def bounds(self):
        return np.vstack([self.k1.bounds, self.k2.bounds])

    @property
    def hyperparameter_names(self):
        return [f"k1__{h}" for h in self.k1.hyperparameter_names] + [f"k2__{h}" for h in self.k2.hyperparameter_names]

    def is_stationary(self):
        return self.k1.is_stationary() and self.k2.is_stationary()


class Sum(_Binary):
    """k = k1 + k2."""

    def _K(self, X, Y):
        return self.k1._K(X, Y) + self.k2._K(X, Y)

    def diag(self, X):
        return self.k1.diag(X) + self.k2.diag(X)

    def _dK(self, X):
        return self.k1._dK(X) + self.k2._dK(X)

    def _contract(self, X, M, K=None):
        return np.concatenate([self.k1._contract(X, M), self.k2._contract(X, M)])

    def _grad_inputs(self, X, Y, M):
        return self.k1._grad_inputs(X, Y, M) + self.k2._grad_inputs(X, Y, M)


class Product(_Binary):
    """k = k1 · k2; ∂(k1 k2) = k2 ∂k1 + k1 ∂k2, so each factor contracts M ∘ (the other's K)."""

    def _K(self, X, Y):
        return self.k1._K(X, Y) * self.k2._K(X, Y)

    def diag(self, X):
        return self.k1.diag(X) * self.k2.diag(X)

    def _dK(self, X):
        K1, K2 = self.k1._K(X, None), self.k2._K(X, None)
        return [d * K2 for d in self.k1._dK(X)] + [d * K1 for d in self.k2._dK(X)]

    def _contract(self, X, M, K=None):
        # each factor's own K is computed once and handed to its contraction; a constant factor
        # scales M instead of being expanded into an n x n matrix
        c1, c2 = self.k1._constant(), self.k2._constant()
        K1 = None if c1 is not None else self.k1._K(X, None)
        K2 = None if c2 is not None else self.k2._K(X, None)
        out = []
        if self.k1.n_dims:
            out.append(self.k1._contract(X, M * (c2 if K2 is None else K2), K=K1))
        if self.k2.n_dims:
            out.append(self.k2._contract(X, M * (c1 if K1 is None else K1), K=K2))
        return np.concatenate(out) if out else np.empty(0)

    def _grad_inputs(self, X, Y, M):
        K1, K2 = self.k1._K(X, Y), self.k2._K(X, Y)
        return self.k1._grad_inputs(X, Y, M * K2) + self.k2._grad_inputs(X, Y, M * K1)


class _ForeignKernel:
    """Adapter giving a scikit-learn kernel gpc's ``gradient_contract`` (through its tensor)."""

    def __init__(self, kernel):
        self.kernel = kernel

    theta = property(lambda self: self.kernel.theta)
    bounds = property(lambda self: self.kernel.bounds)
    n_dims = property(lambda self: len(self.kernel.theta))

    def clone_with_theta(self, theta):
        return _ForeignKernel(self.kernel.clone_with_theta(theta))

    def __call__(self, X, Y=None, eval_gradient=False):
        return self.kernel(X, Y, eval_gradient=eval_gradient)

    def diag(self, X):
        return self.kernel.diag(X)

    def gradient_contract(self, X, M):
        _, dK = self.kernel(X, eval_gradient=True)
        return np.einsum("ij,ijk->k", M, dK)

    def __repr__(self):
        return repr(self.kernel)


def as_kernel(kernel):
    """gpc's kernel interface for a gpc kernel (returned as is) or a scikit-learn-style kernel."""
    if isinstance(kernel, (Kernel, _ForeignKernel)):
        return kernel
    needed = ("theta", "bounds", "diag", "clone_with_theta")
    if all(hasattr(kernel, a) for a in needed) and callable(kernel):
        return _ForeignKernel(kernel)
    raise ValueError(f"{kernel!r} is not a kernel: it needs theta, bounds, diag, clone_with_theta and "
                     "__call__(X, Y=None, eval_gradient=False)")


__all__ = ["Kernel", "RBF", "Matern", "ConstantKernel", "WhiteKernel", "Linear", "Polynomial",
           "Sum", "Product", "as_kernel"]
