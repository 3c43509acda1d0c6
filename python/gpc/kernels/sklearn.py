"""scikit-learn kernels in gpc: the adapter (``as_kernel``, ``_ForeignKernel``) and the translation
of scikit-learn's standard kernels into gpc kernels of the same formula."""

import copy

import numpy as np

from .base import Kernel, _check_M, _check_result, _is_kernel_like
from .matrices import _sqdist
from .simple import ConstantKernel, Linear, WhiteKernel
from .stationary import Matern, RBF, _Stationary


class _ForeignKernel(Kernel):
    """Adapter giving a scikit-learn-interface kernel gpc's interface.

    scikit-learn's standard kernels (RBF, Matern with ν ∈ {0.5, 1.5, 2.5, ∞}, ConstantKernel,
    WhiteKernel, DotProduct, RationalQuadratic and their sums, products and powers) are translated to
    gpc kernels of the same formula (:func:`_translate`), which evaluate K and contract gradients
    without the (n, n, p) tensor (the stationary ones in gpc._kernels, RationalQuadratic in NumPy); θ, bounds and names stay the scikit-learn kernel's (its θ order is k1's then
    k2's, leaf by leaf, as gpc's).  Any other kernel is called as is, and ``gradient_contract``
    forms its gradient tensor and contracts it with einsum: correct, but O(n² p) memory.
    Cross-covariances K(X, Y) always come from the scikit-learn kernel itself (WhiteKernel(X, Y)
    is zero there even when Y is X).  A kernel with ``requires_vector_input = False`` (strings,
    graphs) receives its inputs unconverted.
    """

    def __init__(self, kernel):
        self.kernel = kernel

    @property
    def kernel(self):
        """The scikit-learn kernel (for one made by :meth:`_with_theta`, cloned when first asked
        for)."""
        if self._kernel is None:
            self._kernel = self._root.clone_with_theta(self._root_theta)
            self._root = self._root_theta = None
        return self._kernel

    @kernel.setter
    def kernel(self, kernel):
        self._kernel, self._root, self._root_theta = kernel, None, None
        self._validate()

    def _validate(self):
        """After ``set_params`` (the kernel replaced or changed in place): translated afresh."""
        self._fast = _translate(self.kernel)
        self.__dict__.pop("_same", None)

    def _with_theta(self, theta):
        """``clone_with_theta(theta)`` for a θ from this kernel's own (a training step's).

        Where the translation has the scikit-learn kernel's θ and bounds (every standard kernel
        but DotProduct's free σ0, whose translation holds σ0²), only the translation moves, and
        the scikit-learn kernel is cloned when first asked for (:attr:`kernel`): a step of a
        minibatch fit does not pay scikit-learn's clone (a deep copy of its parameters).  Both
        hold exp(θ), so the result is the same bits either way."""
        if self._fast is None or not self._same_theta():
            return self.clone_with_theta(theta)
        new = copy.copy(self)
        new._fast = self._fast._with_theta(theta)
        new._kernel, new._root, new._root_theta = None, self._source(), np.array(theta, dtype=float)
        return new

    def _same_theta(self):
        """Whether the translation's θ and bounds are the scikit-learn kernel's (checked once)."""
        same = self.__dict__.get("_same")
        if same is None:
            fast = self._fast
            same = self.__dict__["_same"] = bool(
                fast is not None and fast.n_dims == self.n_dims
                and np.array_equal(fast.theta, self.theta)
                and np.array_equal(np.reshape(fast.bounds, (-1, 2)), self.bounds))
        return same

    @property
    def theta(self):
        return np.asarray(self.kernel.theta, dtype=float)

    @theta.setter
    def theta(self, theta):
        self.kernel.theta = self._check_theta(theta)
        self._validate()

    @property
    def bounds(self):
        return np.reshape(np.asarray(self.kernel.bounds, dtype=float), (-1, 2))

    @property
    def hyperparameter_names(self):
        names = []
        for h in getattr(self.kernel, "hyperparameters", []):
            if getattr(h, "fixed", False):
                continue
            n = getattr(h, "n_elements", 1)
            names.extend([h.name] if n == 1 else [f"{h.name}[{i}]" for i in range(n)])
        if len(names) != self.n_dims:
            names = [f"theta[{i}]" for i in range(self.n_dims)]
        return names

    def _check_bounds_params(self):
        """The scikit-learn kernel's own warning (scikit-learn's ConvergenceWarning and message)."""
        own = getattr(self.kernel, "_check_bounds_params", None)
        return own() if callable(own) else super()._check_bounds_params()

    def clone_with_theta(self, theta):
        return _ForeignKernel(self.kernel.clone_with_theta(self._check_theta(theta)))

    def _vector_input(self):
        return getattr(self._source(), "requires_vector_input", True)

    def _source(self):
        """The scikit-learn kernel, or for one not yet cloned the kernel it is cloned from (of the
        same classes): for class-level attributes, without cloning."""
        return self._root if self._kernel is None else self._kernel

    def __call__(self, X, Y=None, eval_gradient=False):
        if Y is not None or not self._vector_input():
            return self.kernel(X, Y, eval_gradient=eval_gradient) if eval_gradient else self.kernel(X, Y)
        return super().__call__(X, None, eval_gradient)

    def diag(self, X):
        return super().diag(X) if self._vector_input() else self.kernel.diag(X)

    def gradient_contract(self, X, M, K=None, symmetric=False):
        if self._vector_input():
            return super().gradient_contract(X, M, K=K, symmetric=symmetric)
        M = _check_M(M, (len(X), len(X)))
        return _check_result(self._contract(X, M), M)

    def _call(self, X, Y, eval_gradient):
        if self._fast is not None and Y is None:
            return self._fast._call(X, None, eval_gradient)
        return self.kernel(X, Y, eval_gradient=eval_gradient) if eval_gradient else self.kernel(X, Y)

    def _diag(self, X):
        return self.kernel.diag(X) if self._fast is None else self._fast._diag(X)

    def _contract(self, X, M, K=None, symmetric=False):
        if self._fast is not None:
            return self._fast._contract(X, M, K=K, symmetric=symmetric)
        _, dK = self.kernel(X, eval_gradient=True)
        return np.einsum("ij,ijk->k", M, dK)

    def _contract_value(self, X, M, K=None, scale=1.0, symmetric=False):
        if self._fast is not None:
            return self._fast._contract_value(X, M, K=K, scale=scale, symmetric=symmetric)
        return super()._contract_value(X, M, K=K, scale=scale, symmetric=symmetric)

    def _constant(self):
        return None if self._fast is None else self._fast._constant()

    def _diagonal(self):
        return self._fast is not None and self._fast._diagonal()

    def _reads_lower_triangle(self):
        return self._fast is not None and self._fast._reads_lower_triangle()

    def _gram_is_cross(self):
        return self._fast is not None and self._fast._gram_is_cross()

    def _bound_to(self, Z):
        return super()._bound_to(Z) if self._fast is None else self._fast._bound_to(Z)

    def _bound_scaled(self, Z, scale, constant):
        return None if self._fast is None else self._fast._bound_scaled(Z, scale, constant)

    def _cross(self, X, Z, scale=1.0):
        if self._fast is not None:
            return self._fast._cross(X, Z, scale)
        return super()._cross(X, Z, scale)

    def _cross_gradient(self, X, Z, G, w, K=None, scale=1.0, overwrite=False):
        if self._fast is not None:
            return self._fast._cross_gradient(X, Z, G, w, K, scale, overwrite)
        return super()._cross_gradient(X, Z, G, w, K, scale, overwrite)

    def _has_grad_inputs(self):
        return self._fast is not None and self._fast._has_grad_inputs()

    def _grad_inputs(self, X, Y, M):
        if self._fast is not None:
            return self._fast._grad_inputs(X, Y, M)
        raise NotImplementedError(
            f"gradient_inputs is not available for the foreign kernel {self.kernel!r}; "
            "use a gpc kernel to optimise inducing inputs")

    def is_stationary(self):
        f = getattr(self._source(), "is_stationary", None)
        return bool(f()) if callable(f) else False

    def __repr__(self):
        return f"as_kernel({self.kernel!r})"


class _DotProductOffset(ConstantKernel):
    """scikit-learn DotProduct's σ0² as a constant whose θ is log σ0: ∂σ0²/∂log σ0 = 2σ0²."""

    def _contract(self, X, M, K=None, symmetric=False):
        return 2.0 * super()._contract(X, M, K=K, symmetric=symmetric)


class _RationalQuadratic(Kernel):
    r"""scikit-learn's RationalQuadratic, :math:`k = (1 + d / (2 \alpha \ell^2))^{-\alpha}`,
    d = |x - y|², in NumPy: θ = (log α, log ℓ) (scikit-learn's order), free ones only, with

    :math:`\partial k / \partial \log\ell = (d / \ell^2)\, b^{-\alpha - 1}`,
    :math:`\partial k / \partial \log\alpha = k\,(-\alpha \log b + d / (2 \ell^2 b))`, b = 1 + d/(2αℓ²).
    """

    def __init__(self, alpha, length_scale, free_alpha, free_length_scale):
        self.alpha, self.length_scale = float(alpha), float(length_scale)
        self.free = (free_alpha, free_length_scale)

    @property
    def theta(self):
        values = np.log([self.alpha, self.length_scale])
        return values[np.array(self.free)]

    @theta.setter
    def theta(self, theta):
        values = np.log([self.alpha, self.length_scale])
        values[np.array(self.free)] = self._check_theta(theta)
        self.alpha, self.length_scale = np.exp(values)

    @property
    def bounds(self):
        return np.zeros((int(sum(self.free)), 2))

    def _parts(self, X, Y):
        U = X - X.mean(axis=0)
        D = _sqdist(U, None if Y is None else Y - X.mean(axis=0))
        base = 1.0 + D / (2.0 * self.alpha * self.length_scale ** 2)
        return D, base, base ** -self.alpha

    def _call(self, X, Y, eval_gradient):
        D, base, K = self._parts(X, Y)
        if not eval_gradient:
            return K
        grads = self._gradients(D, base, K)
        return K, (np.stack(grads, axis=2) if grads else np.empty(K.shape + (0,)))

    def _gradients(self, D, base, K):
        a, ls = self.alpha, self.length_scale
        out = []
        if self.free[0]:
            out.append(K * (-a * np.log(base) + D / (2.0 * ls ** 2 * base)))
        if self.free[1]:
            out.append(D / ls ** 2 * base ** (-a - 1.0))
        return out

    def _diag(self, X):
        return np.ones(X.shape[0])

    def _contract(self, X, M, K=None, symmetric=False):
        D, base, Kx = self._parts(X, None)
        return np.array([np.vdot(M, G) for G in self._gradients(D, base, Kx)])


def _translate(kernel):
    """The gpc kernel computing scikit-learn's ``kernel`` (same formula, same θ order), or None.

    Classes are recognised by their scikit-learn module and name, so a subclass (which may change
    the formula) keeps the generic path.  Matern with ν = ∞ is the squared exponential.
    """
    from .operators import Product, Sum, _Power

    kind = type(kernel)
    if kind.__module__ != "sklearn.gaussian_process.kernels":
        return None
    name = kind.__name__
    try:
        if name in ("Sum", "Product"):
            a, b = _translate(kernel.k1), _translate(kernel.k2)
            if a is None or b is None:
                return None
            return Sum(a, b) if name == "Sum" else Product(a, b)
        if name == "RBF" or (name == "Matern" and np.isinf(kernel.nu)):
            return RBF(kernel.length_scale, kernel.length_scale_bounds)
        if name == "Matern" and kernel.nu in (0.5, 1.5, 2.5):
            return Matern(kernel.length_scale, kernel.length_scale_bounds, nu=float(kernel.nu))
        if name == "ConstantKernel":
            return ConstantKernel(kernel.constant_value, kernel.constant_value_bounds)
        if name == "WhiteKernel":
            return WhiteKernel(kernel.noise_level, kernel.noise_level_bounds)
        if name == "DotProduct":   # σ0² + x·y
            bounds = kernel.sigma_0_bounds
            bounds = bounds if isinstance(bounds, str) else np.square(np.asarray(bounds, dtype=float))
            return Sum(_DotProductOffset(kernel.sigma_0 ** 2, bounds), Linear(1.0, "fixed"))
        if name == "Exponentiation":
            base = _translate(kernel.kernel)
            return None if base is None else _Power(base, kernel.exponent)
        if name == "RationalQuadratic":
            return _RationalQuadratic(kernel.alpha, kernel.length_scale,
                                      not kernel.hyperparameter_alpha.fixed,
                                      not kernel.hyperparameter_length_scale.fixed)
    except (ValueError, TypeError):   # a parameter gpc's kernel does not take (e.g. infinite bounds)
        return None
    return None


def user_kernel(kernel):
    """The kernel as the user gave it: the scikit-learn object inside gpc's adapter, else ``kernel``.

    Parameters
    ----------
    kernel : Kernel
        A kernel, possibly the adapter :func:`as_kernel` made.
    """
    return kernel.kernel if isinstance(kernel, _ForeignKernel) else kernel


def as_kernel(kernel):
    """Return ``kernel`` with gpc's interface.

    A gpc :class:`Kernel` is returned as is; any object with the scikit-learn kernel interface
    (``theta``, ``bounds``, ``__call__(X, Y=None, eval_gradient=False)``, ``diag``,
    ``clone_with_theta``) is wrapped in an adapter that runs scikit-learn's standard kernels on
    gpc's compiled ones and any other through its own ``__call__`` (see :class:`_ForeignKernel`).

    Parameters
    ----------
    kernel : Kernel or scikit-learn kernel
        The kernel to adapt.
    """
    if isinstance(kernel, Kernel):
        return kernel
    if not callable(kernel) or not _is_kernel_like(kernel):
        raise TypeError(f"{kernel!r} is not a kernel: it needs theta, bounds, __call__, diag "
                        "and clone_with_theta")
    return _ForeignKernel(kernel)
