"""
Inducing points moving during training
======================================

The sparse classifier (:class:`gpc.SparseGaussianProcessClassifier`, the scalable EP of the SEP
paper) carries the latent function by :math:`m` inducing points :math:`Z`. They start at k-means
centres of the inputs and follow the gradient of the EP evidence :math:`\\log Z_q` (SEP eq. (4))
together with the kernel's hyperparameters. Here :math:`m = 8` points on 1000 rows of banana,
trained in batch: each ``partial_fit`` call is one pass of site updates followed by one step of
the hyperparameters and of :math:`Z`, and the path of every inducing point is drawn from its start
(open circle) to where it is after 20 passes (filled). The right panel shows the evidence and the
error on 1000 held-out points after each pass. (Adadelta's first steps are short, so 20 passes move
the points only part of the way; see :doc:`/guide/scaling_up`.)
"""

import matplotlib.pyplot as plt
import numpy as np

from gpc import SparseGaussianProcessClassifier
from gpc.datasets import load_banana

X, y = load_banana(return_X_y=True)
rng = np.random.default_rng(0)
order = rng.permutation(len(y))
train, test = order[:1000], order[1000:2000]

clf = SparseGaussianProcessClassifier(n_inducing=8, batch_size=None, max_iter=1, random_state=0,
                                      progress=False, validation_data=(X[test], y[test]))
clf.fit(X[train], y[train])
paths = [clf.inducing_points_.copy()]
for _ in range(19):
    clf.partial_fit(X[train], y[train])
    paths.append(clf.inducing_points_.copy())
paths = np.array(paths)                         # (passes, m, 2)

grid = np.linspace(-3.0, 3.0, 80)
G1, G2 = np.meshgrid(grid, grid)
p = clf.predict_proba(np.column_stack([G1.ravel(), G2.ravel()]))[:, 1].reshape(G1.shape)

fig, (ax, ax_h) = plt.subplots(1, 2, figsize=(11, 4.5))
ax.contourf(G1, G2, p, levels=np.linspace(0, 1, 11), cmap="RdBu_r", alpha=0.6)
ax.contour(G1, G2, p, levels=[0.5], colors="k", linewidths=1.2)
ax.scatter(*X[train].T, c=(y[train] == clf.classes_[1]), cmap="RdBu_r", s=4, alpha=0.5)
for k in range(paths.shape[1]):
    ax.plot(paths[:, k, 0], paths[:, k, 1], "-", color="k", lw=1)
ax.scatter(*paths[0].T, facecolors="none", edgecolors="k", s=40, label="start (k-means)")
ax.scatter(*paths[-1].T, c="k", s=40, label="after 20 passes")
ax.set_xlim(-3, 3)
ax.set_ylim(-3, 3)
ax.legend(loc="lower left", fontsize=8)
ax.set_title("inducing points and p(y = +1 | x)")

history = clf.history_
passes = [h["iteration"] for h in history]
ax_h.plot(passes, [h["objective"] for h in history], "o-", label="log Z_q")
ax_h.set_xlabel("pass over the data")
ax_h.set_ylabel("log Z_q")
ax_e = ax_h.twinx()
ax_e.plot(passes, [h["val_error"] for h in history], "s--", color="C1", label="held-out error")
ax_e.set_ylabel("held-out error")
ax_h.set_title("training history")
fig.tight_layout()
plt.show()
