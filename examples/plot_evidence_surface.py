"""
The evidence surface over two hyperparameters
=============================================

Type-II maximum likelihood picks the kernel's hyperparameters :math:`\\theta = (\\sigma^2, \\ell)`
of :math:`\\sigma^2 \\, \\mathrm{RBF}(\\ell)` by maximising an approximation of
:math:`\\log p(y \\mid X, \\theta)`. Each method has its own approximation: Laplace's (R&W eq.
(3.32)), EP's (NR eq. (13)) and the lower bound of the variational-bound method (NR eq.
(18)-(21); with the probit likelihood, the tangent bound). This example evaluates the three on a
grid for 150 points of the banana set
(``log_marginal_likelihood(theta)`` of a fitted estimator, with ``theta`` in log space) and marks
where each fit's optimiser stopped.
"""

import matplotlib.pyplot as plt
import numpy as np

from gpc import GaussianProcessClassifier
from gpc.datasets import load_banana
from gpc.kernels import RBF, ConstantKernel

X, y = load_banana(return_X_y=True)
rows = np.random.default_rng(1).permutation(len(y))[:150]
X, y = X[rows], y[rows]

log_var = np.linspace(np.log(0.1), np.log(100.0), 15)
log_len = np.linspace(np.log(0.1), np.log(5.0), 15)

fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
for ax, method in zip(axes, ["laplace", "ep", "vb"]):
    clf = GaussianProcessClassifier(kernel=ConstantKernel(1.0) * RBF(1.0), likelihood="probit",
                                    method=method).fit(X, y)
    surface = np.array([[clf.log_marginal_likelihood(np.array([a, b])) for a in log_var]
                        for b in log_len])
    top = surface.max()
    filled = ax.contourf(np.exp(log_var), np.exp(log_len), surface,
                         levels=np.linspace(top - 40, top, 21), extend="min", cmap="viridis")
    ax.plot(*np.exp(clf.kernel_.theta), "r*", markersize=12, label="optimum found")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(r"$\sigma^2$")
    ax.set_title(f"{method}: max {clf.log_marginal_likelihood_value_:.2f}")
    fig.colorbar(filled, ax=ax)
axes[0].set_ylabel(r"$\ell$")
axes[0].legend(loc="upper left")
fig.tight_layout()
plt.show()
