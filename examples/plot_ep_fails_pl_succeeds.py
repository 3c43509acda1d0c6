"""
EP fails where posterior linearisation does not
===============================================

The example of the posterior-linearisation paper's supplement (PL, Figure 1): two latent values
with prior mean :math:`(-0.5, -3)`, unit variances and correlation 0.8, both labels +1, and the
noisy-threshold likelihood :math:`p(y \\mid f) = \\varepsilon + (1 - 2\\varepsilon) H(y f)` with
:math:`\\varepsilon = 0.01` (PL eq. (3)). The likelihood is not log-concave. EP without fixes
(``on_negative="raise"``) meets a negative cavity variance and stops: the paper reports
:math:`-117.9`. PL's site update (PL eq. (9)-(18)) has no cavity and converges to a Gaussian in
the quadrant of highest posterior density.

The exact posterior is drawn on a grid (its contours are log-spaced).
"""

import matplotlib.pyplot as plt
import numpy as np

from gpc import NegativeVarianceError, infer
from gpc.experiments.pl_figure1 import EPS, PRIOR_COV, PRIOR_MEAN, Y, exact_posterior
from gpc.likelihoods import NoisyThreshold

likelihood = NoisyThreshold(EPS)
try:
    infer(PRIOR_COV, Y, likelihood, method="ep", schedule="parallel", prior_mean=PRIOR_MEAN,
          on_negative="raise")
    ep_outcome = "EP converged"
except NegativeVarianceError as err:
    ep_outcome = f"EP stops: cavity variance {err.cavity_variance:.1f} at site {err.index + 1}"
print(ep_outcome)

pl = infer(PRIOR_COV, Y, likelihood, method="pl", schedule="parallel", prior_mean=PRIOR_MEAN)
mean, cov = pl.posterior.mean, pl.posterior.cov()
print("PL mean", mean, "converged:", pl.converged)

exact = exact_posterior(n_grid=300)
fig, ax = plt.subplots(figsize=(6, 5))
density = exact["density"]
levels = np.exp(np.linspace(np.log(density.max()) - 12, np.log(density.max()), 12))
ax.contour(exact["f1"], exact["f2"], density, levels=levels, cmap="Greys")
# the PL Gaussian's 3-sigma ellipse
angle = np.linspace(0, 2 * np.pi, 200)
ellipse = mean[:, None] + 3 * np.linalg.cholesky(cov) @ np.vstack([np.cos(angle), np.sin(angle)])
ax.plot(*ellipse, color="tab:red", label="PL, 3σ")
ax.plot(*mean, "x", color="tab:red", markersize=10, mew=2, label="PL mean")
ax.plot(*exact["mean"], "o", color="k", mfc="none", markersize=9, label="exact mean")
ax.plot(*PRIOR_MEAN, "+", color="tab:blue", markersize=10, mew=2, label="prior mean")
ax.axhline(0, color="0.7", lw=0.5)
ax.axvline(0, color="0.7", lw=0.5)
ax.set_xlabel("$f_1$")
ax.set_ylabel("$f_2$")
ax.set_title(ep_outcome, fontsize=10)
ax.legend(loc="lower right", fontsize=8)
plt.show()
