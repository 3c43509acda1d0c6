"""
Finding mislabelled points with outlier probabilities
=====================================================

The robust multi-class GP classifier (:class:`gpc.MultiClassGPC`, ``model="robust"``; RMGPC,
Hernández-Lobato, Hernández-Lobato & Dupont 2011) gives every training row a posterior probability
:math:`P(z_i = 1 \\mid y, X)` that its label is noise rather than explained by the latent
functions (RMGPC eq. (21)). Here 10 of the 215 labels of the bundled new-thyroid data (three
classes) are changed to another class at random, and the model is fitted with a fixed RBF kernel on
the standardised inputs (EP capped at 40 iterations, which is enough for the ranking). The left
panel shows every row's outlier probability, the flipped rows in red; the right panel two of
the five inputs, each row's marker size growing with its outlier probability. See
:doc:`/guide/outliers` for choosing between the robust and the standard model.
"""

import matplotlib.pyplot as plt
import numpy as np

from gpc import MultiClassGPC
from gpc.datasets import load_thyroid
from gpc.kernels import RBF

data = load_thyroid(binary=False)
X = (data.X - data.X.mean(axis=0)) / data.X.std(axis=0)
y = data.y.copy()
rng = np.random.default_rng(0)
flipped = rng.choice(len(y), size=10, replace=False)
classes = np.unique(y)
for i in flipped:
    y[i] = rng.choice(classes[classes != y[i]])

clf = MultiClassGPC(kernel=RBF(2.0), model="robust", optimizer=None, max_iter=40, tol=1e-3)
clf.fit(X, y)
p = clf.outlier_probability_
top = np.argsort(p)[::-1][:10]
print(f"flipped rows among the 10 most probable outliers: {len(set(top) & set(flipped))} of 10")

fig, (ax, ax_x) = plt.subplots(1, 2, figsize=(11, 4))
is_flipped = np.isin(np.arange(len(y)), flipped)
ax.vlines(np.flatnonzero(~is_flipped), 0, p[~is_flipped], color="0.5", lw=1)
ax.vlines(np.flatnonzero(is_flipped), 0, p[is_flipped], color="C3", lw=2, label="label flipped")
ax.axhline(0.5, color="k", lw=0.8, ls=":")
ax.set_xlabel("training row")
ax.set_ylabel("P(z = 1 | y, X)")
ax.set_title("posterior outlier probability of every row")
ax.legend(loc="upper right")

a, b = list(data.feature_names).index("RT3U"), list(data.feature_names).index("TSH")
for k, c in enumerate(classes):
    rows = y == c
    ax_x.scatter(X[rows, a], X[rows, b], s=10 + 150 * p[rows], color=f"C{k}", alpha=0.6,
                 label=f"labelled {c}")
ax_x.scatter(X[flipped, a], X[flipped, b], s=10 + 150 * p[flipped], facecolors="none",
             edgecolors="C3", linewidths=1.5, label="flipped")
ax_x.set_xlabel(f"{data.feature_names[a]} (standardised)")
ax_x.set_ylabel(f"{data.feature_names[b]} (standardised)")
ax_x.legend(fontsize=8)
ax_x.set_title("marker size: outlier probability")
fig.tight_layout()
plt.show()
