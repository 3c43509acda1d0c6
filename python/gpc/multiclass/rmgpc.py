"""RMGPC and SMGPC as models of ``MultiClassGPC`` (RMGPC paper): the EP evidence (16) at θ with its
gradient (18), and the predictive probabilities (19)-(20).

EP itself is :func:`gpc.multiclass.ep.rmgpc_ep` (``robust=False`` is SMGPC: b₀ → ∞, no outliers);
this module maps the estimator's θ to its inputs, one K_k per class (SMGPC with its ϑ_k² on the
diagonal, §4), and the gradient matrices M_k back to θ.
"""

import warnings

import numpy as np

from .. import _threads
from ..exceptions import ConvergenceWarning
from .ep import rmgpc_ep
from .predict import predict_proba

#: SMGPC's latent noise ϑ_k² (RMGPC §4): starting value and bounds
NOISE_INIT, NOISE_BOUNDS = 0.1, (1e-6, 1e2)
#: a fit that ends unconverged advises standardising X when the features' standard deviations
#: differ by more than this factor
FEATURE_SCALE_SPREAD = 10.0


def class_matrices(kernels, noise, X):
    """K_k (+ ϑ_k² I with ``noise``) for every class, each distinct kernel evaluated once; and
    the cache {id(kernel): K} the gradient contracts against."""
    cache, Ks = {}, []
    for k, kern in enumerate(kernels):
        if id(kern) not in cache:
            cache[id(kern)] = kern(X)
        K = cache[id(kern)]
        Ks.append(K + noise[k] * np.eye(len(X)) if noise is not None else K)
    return Ks, cache


def evidence(est, theta, X, y, eval_gradient=True, init=None, *, robust):
    """EP's state at θ (RMGPC with ``robust``, else SMGPC) and, with ``eval_gradient``, the gradient
    of its log evidence in θ (:class:`gpc.multiclass.models.MultiClassModel`'s ``evidence``).

    The gradient is eq. (18), Σ_ij (M_k)_ij ∂(K_k)_ij/∂θ, summed over the classes for a shared
    kernel; ∂K_k/∂ log ϑ_k² = ϑ_k² I gives ϑ_k² tr M_k; and ρ ∝ ε gives ∂/∂ log ε = ρ ∂/∂ρ
    (docs/derivations-rmgpc.md).
    """
    kernels, noise, rate = est._unpack(theta)
    Ks, cache = class_matrices(kernels, noise, X)
    res = rmgpc_ep(Ks, y, est.n_classes_, a0=est.a0, b0=est.b0, robust=robust, max_iter=est.max_iter,
                   tol=est.tol, init=init,
                   n_threads=_threads.engine_threads("classes", len(y), est.n_jobs), rate=rate,
                   warn=False)
    if not eval_gradient:
        return res
    Ms = res.gradient_matrices()
    grads = []
    if est.shared_kernel:
        grads.append(kernels[0].gradient_contract(X, sum(Ms), K=cache[id(kernels[0])], symmetric=True))
    else:
        grads += [kern.gradient_contract(X, M, K=cache[id(kern)], symmetric=True)
                  for kern, M in zip(kernels, Ms)]
    if noise is not None:
        grads.append(noise * np.array([np.trace(M) for M in Ms]))
    if est._learns_noise():
        grads.append([rate * res.rate_gradient()])
    return res, np.concatenate(grads)


def predictive(est, X):
    """P(y* = k | x*) of the fitted ``est`` at the rows X, RMGPC eq. (19)-(20) (SMGPC: the latent
    noise ϑ_k² added to each class's prior variance)."""
    crosses, diags, cache = [], [], {}
    for k, kern in enumerate(est.kernels_):
        if id(kern) not in cache:
            cache[id(kern)] = (kern(X, est.X_train_), kern.diag(X))
        Kc, kd = cache[id(kern)]
        crosses.append(Kc)
        diags.append(kd + est.noise_[k] if est.noise_ is not None else kd)
    return predict_proba(est.ep_result_, crosses, diags)


def warn_unconverged(est, X):
    """A ConvergenceWarning for EP stopped by ``max_iter`` at the fitted θ, called by ``fit`` (the
    optimiser's other evaluations only steer the search; an unconverged one among them is not the
    fit's result).  It advises standardising X only when the features' scales differ."""
    sd = X.std(axis=0)
    sd = sd[sd > 0]
    spread = float(sd.max() / sd.min()) if sd.size else 1.0
    advice = (f"the features' standard deviations differ by a factor {spread:.3g}: standardise X "
              "(e.g. scikit-learn's StandardScaler) or give the kernel one length scale per "
              "feature" if spread > FEATURE_SCALE_SPREAD else
              "raise max_iter, or try n_restarts_optimizer > 0 for other hyperparameters")
    warnings.warn(f"EP did not converge in max_iter={est.max_iter} iterations at the fitted "
                  "hyperparameters: the posterior and outlier probabilities are its last iterate, "
                  f"not EP's fixed point; {advice}", ConvergenceWarning, stacklevel=3)
