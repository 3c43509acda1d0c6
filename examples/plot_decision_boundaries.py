"""
Decision boundaries of every method on banana
=============================================

Each inference method of gpc fits the same 200 points of the banana set with the same kernel,
:math:`2 \\cdot \\mathrm{RBF}(0.7)`, and the probit likelihood, and draws its predictive probability
:math:`p(y = +1 \\mid x)` (the 0.5 contour in black). The hyperparameters are held fixed
(``optimizer=None``) so that the pictures differ only by the approximation, and the example runs in
a few seconds. The title gives each method's log evidence (or the bound it maximises) and the test
error on 1000 other points.
"""

import matplotlib.pyplot as plt
import numpy as np

from gpc import GaussianProcessClassifier, available_methods
from gpc.datasets import load_banana
from gpc.kernels import RBF, ConstantKernel

X, y = load_banana(return_X_y=True)
rng = np.random.default_rng(0)
order = rng.permutation(len(y))
train, test = order[:200], order[200:1200]

grid = np.linspace(-3.0, 3.0, 60)
G1, G2 = np.meshgrid(grid, grid)
X_grid = np.column_stack([G1.ravel(), G2.ravel()])

methods = available_methods()
fig, axes = plt.subplots(2, (len(methods) + 1) // 2, figsize=(12, 6), sharex=True, sharey=True)
for ax, method in zip(axes.ravel(), methods):
    clf = GaussianProcessClassifier(kernel=ConstantKernel(2.0) * RBF(0.7), likelihood="probit",
                                    method=method, optimizer=None)
    clf.fit(X[train], y[train])
    p = clf.predict_proba(X_grid)[:, 1].reshape(G1.shape)
    error = np.mean(clf.predict(X[test]) != y[test])
    ax.contourf(G1, G2, p, levels=np.linspace(0, 1, 11), cmap="RdBu_r", alpha=0.8)
    ax.contour(G1, G2, p, levels=[0.5], colors="k", linewidths=1.5)
    ax.scatter(*X[train].T, c=(y[train] == clf.classes_[1]), cmap="RdBu_r", s=6, edgecolors="k",
               linewidths=0.2)
    ax.set_title(f"{method}\nlog Z {clf.log_marginal_likelihood_value_:.1f}, error {error:.3f}",
                 fontsize=9)
for ax in axes.ravel()[len(methods):]:
    ax.axis("off")
fig.tight_layout()
plt.show()
