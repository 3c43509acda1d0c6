"""
Speed against scikit-learn
==========================

gpc's Laplace approximation computes what scikit-learn's ``GaussianProcessClassifier`` computes
(R&W Alg. 3.1 and 5.1), so their log marginal likelihoods agree; gpc's is faster. This example
times one evaluation of the log marginal likelihood and its gradient, the inner loop of type-II
maximum likelihood, on the first *n* points of the banana set, with BLAS limited to one thread on
both sides (threadpoolctl), and plots the ratio of the times. The figures of ``bench/RESULTS.md``
were measured the same way by ``python -m pytest bench``; a docs build runs on a busy machine, so
read the ratio, not the milliseconds.
"""

import time

import matplotlib.pyplot as plt
import numpy as np
from sklearn.gaussian_process import GaussianProcessClassifier as SklearnGPC
from sklearn.gaussian_process.kernels import RBF as SklearnRBF
from sklearn.gaussian_process.kernels import ConstantKernel as SklearnConstant
from threadpoolctl import threadpool_limits

from gpc import GaussianProcessClassifier
from gpc.datasets import load_banana
from gpc.kernels import RBF, ConstantKernel

X, y = load_banana(return_X_y=True)


def best_time(evaluate, repeats=3):
    """The fastest of ``repeats`` runs: the least disturbed by other work on the machine."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        evaluate()
        times.append(time.perf_counter() - start)
    return min(times)


sizes = [200, 400, 800]
ratios = []
with threadpool_limits(limits=1, user_api="blas"):
    for n in sizes:
        ours = GaussianProcessClassifier(kernel=ConstantKernel(2.0) * RBF(0.7), likelihood="logit",
                                         method="laplace", optimizer=None).fit(X[:n], y[:n])
        theirs = SklearnGPC(kernel=SklearnConstant(2.0) * SklearnRBF(0.7), optimizer=None).fit(X[:n], y[:n])
        theta = ours.kernel_.theta
        lml_ours = ours.log_marginal_likelihood(theta, eval_gradient=True)[0]
        lml_theirs = theirs.log_marginal_likelihood(theta, eval_gradient=True)[0]
        t_ours = best_time(lambda: ours.log_marginal_likelihood(theta, eval_gradient=True))
        t_theirs = best_time(lambda: theirs.log_marginal_likelihood(theta, eval_gradient=True))
        ratios.append(t_ours / t_theirs)
        print(f"n = {n}: log Z gpc {lml_ours:.4f}, scikit-learn {lml_theirs:.4f}; "
              f"time ratio gpc / scikit-learn = {ratios[-1]:.2f}")

fig, ax = plt.subplots(figsize=(5, 3.5))
ax.plot(sizes, ratios, "o-")
ax.axhline(1.0, color="0.5", ls="--", label="as fast as scikit-learn")
ax.set_xlabel("n (banana, first n points)")
ax.set_ylabel("time gpc / time scikit-learn")
ax.set_ylim(0, 1.2)
ax.set_title("log marginal likelihood + gradient, 1 BLAS thread", fontsize=10)
ax.legend()
fig.tight_layout()
plt.show()
