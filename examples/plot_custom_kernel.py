"""
Writing your own kernel
=======================

A rational-quadratic kernel with a fixed shape :math:`\\alpha`,

.. math:: k(x, y) = \\left(1 + \\frac{\\lVert x - y \\rVert^2}{2 \\alpha \\ell^2}\\right)^{-\\alpha},

written as a :class:`gpc.kernels.Kernel` subclass (see the user guide's page "Writing your own
kernel"). With :math:`s = \\lVert x - y \\rVert^2 / (2 \\alpha \\ell^2)`,
:math:`\\partial k / \\partial \\log \\ell = 2 \\alpha s (1 + s)^{-\\alpha - 1}`, and the contraction
:math:`\\sum_{ij} M_{ij} \\partial K_{ij} / \\partial \\log \\ell` needs only that n × n matrix.
The example checks the contraction against central differences of :math:`\\sum_{ij} M_{ij}
K_{ij}`, then fits the kernel (times a constant) on 200 points of banana by type-II maximum
likelihood and draws the predictive probability.
"""

import matplotlib.pyplot as plt
import numpy as np
from scipy.spatial.distance import cdist

from gpc import GaussianProcessClassifier
from gpc.datasets import load_banana
from gpc.kernels import ConstantKernel, Kernel


# --- kernel
class RationalQuadratic(Kernel):
    """k(x, y) = (1 + |x - y|² / (2 α ℓ²))^(-α); ℓ is a hyperparameter, α is fixed."""

    _hyper = ("length_scale",)                 # positive, optimised in log space

    def __init__(self, length_scale=1.0, length_scale_bounds=(1e-5, 1e5), alpha=2.0):
        self.length_scale = length_scale
        self.length_scale_bounds = length_scale_bounds
        self.alpha = alpha
        self._validate()

    def _s(self, X, Y):
        return cdist(X, X if Y is None else Y, "sqeuclidean") / (2 * self.alpha * self.length_scale ** 2)

    def _call(self, X, Y, eval_gradient):
        s = self._s(X, Y)
        K = (1 + s) ** -self.alpha
        if not eval_gradient:
            return K
        free = self.length_scale_bounds != "fixed"
        dK = 2 * self.alpha * s * (1 + s) ** (-self.alpha - 1)
        return K, (dK[:, :, None] if free else np.empty(K.shape + (0,)))

    def _diag(self, X):
        return np.ones(X.shape[0])

    def _contract(self, X, M, K=None, symmetric=False):
        if self.length_scale_bounds == "fixed":
            return np.empty(0)
        s = self._s(X, None)
        return np.array([np.vdot(M, 2 * self.alpha * s * (1 + s) ** (-self.alpha - 1))])

    def _grad_inputs(self, X, Y, M):      # only needed to optimise inducing inputs
        W = M * (1 + self._s(X, Y)) ** (-self.alpha - 1) / self.length_scale ** 2
        return -(W.sum(1)[:, None] * X - W @ Y)
# --- end kernel


# The contraction against central differences in log ℓ.
rng = np.random.default_rng(0)
Z = rng.normal(size=(30, 2))
M = rng.normal(size=(30, 30))
kernel = RationalQuadratic(0.8)
step = 1e-5
value = [np.vdot(M, kernel.clone_with_theta(kernel.theta + d)(Z)) for d in (step, -step)]
print("contraction", kernel.gradient_contract(Z, M)[0],
      "central difference", (value[0] - value[1]) / (2 * step))

X, y = load_banana(return_X_y=True)
rows = rng.permutation(len(y))[:200]
clf = GaussianProcessClassifier(kernel=ConstantKernel(1.0) * RationalQuadratic(1.0), method="ep")
clf.fit(X[rows], y[rows])
print("fitted kernel:", clf.kernel_)

grid = np.linspace(-3.0, 3.0, 60)
G1, G2 = np.meshgrid(grid, grid)
p = clf.predict_proba(np.column_stack([G1.ravel(), G2.ravel()]))[:, 1].reshape(G1.shape)
fig, ax = plt.subplots(figsize=(5, 4.5))
ax.contourf(G1, G2, p, levels=np.linspace(0, 1, 11), cmap="RdBu_r", alpha=0.8)
ax.contour(G1, G2, p, levels=[0.5], colors="k")
ax.scatter(*X[rows].T, c=(y[rows] == clf.classes_[1]), cmap="RdBu_r", s=8, edgecolors="k", linewidths=0.2)
ax.set_title(f"EP, rational quadratic (α = 2)\nlog Z = {clf.log_marginal_likelihood_value_:.2f}", fontsize=10)
plt.show()
