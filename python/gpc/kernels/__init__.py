"""Covariance functions for gpc.

Every kernel keeps its positive hyperparameters as plain attributes (the constructor arguments)
and exposes them to optimisers as ``theta``: the natural logarithm of the free (not fixed)
hyperparameters, concatenated in a flat array, with log-space ``bounds`` of shape (p, 2).  The
interface follows scikit-learn's kernel API (``theta``, ``bounds``, ``__call__``, ``diag``,
``clone_with_theta``, ``get_params``/``set_params``, ``+`` and ``*``) so that a gpc kernel can stand
in for a scikit-learn kernel and ``sklearn.base.clone`` rebuilds it.

What gpc's own inference code uses instead of the (n, n, p) gradient tensor is the contraction

    gradient_contract(X, M)[k] = sum_ij M_ij dK_ij / d theta_k        (theta = log hyperparameters)

which each kernel computes in O(n^2) memory without forming the tensor, and

    gradient_inputs(X, Y, M)[i, d] = sum_j M_ij d k(x_i, y_j) / d x_id

(the derivative with respect to the *first* argument only) for optimising inducing inputs.  The
derivative of sum_ij M_ij k(z_i, z_j) with respect to Z is therefore
``gradient_inputs(Z, Z, M) + gradient_inputs(Z, Z, M.T)``.

Stationary kernels write k = f(r) with the scaled distance r^2 = sum_d (x_d - y_d)^2 / l_d^2 and
share one identity: with W(r) = -f'(r) / r,

    d k / d log l_d = W(r) (x_d - y_d)^2 / l_d^2,      d k / d x_d = -W(r) (x_d - y_d) / l_d^2,

so a single n x n weight matrix W serves every length scale (isotropic: d k / d log l = W r^2).
"""

from .base import Kernel
from .operators import Product, Sum, _Power  # noqa: F401  (_Power: private, for tests)
from .simple import ConstantKernel, Linear, Polynomial, WhiteKernel
from .sklearn import (_ForeignKernel, _RationalQuadratic,  # noqa: F401
                      _translate, as_kernel, user_kernel)
from .stationary import Matern, RBF

__all__ = [
    "Kernel", "RBF", "Matern", "Polynomial", "Linear", "ConstantKernel", "WhiteKernel",
    "Sum", "Product", "as_kernel", "user_kernel",
]

