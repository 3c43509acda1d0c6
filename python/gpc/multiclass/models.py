"""``MultiClassGPC``'s models, a typed registry: ``MODELS`` maps ``model=`` to a :class:`MultiClassModel`.

The estimator holds what every model shares (validation, θ's kernel part and its pure amplitudes,
type-II ML with warm starts, the fitted attributes) and asks the model entry for the rest.
Both callables of an entry take the estimator ``est``: its settings, and ``est._unpack(theta)``,
which splits θ into the classes' kernels, the model's per-class parameters and the fixed outlier
rate.  Adding a multi-class model: write its module, with ``evidence(est, theta, X, y,
eval_gradient, init)`` and ``predictive(est, X)`` (as :mod:`gpc.multiclass.rmgpc` and
:mod:`gpc.multiclass.htpc` do), and add one ``MultiClassModel`` entry to ``MODELS``.
"""

from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

from . import htpc, rmgpc


@dataclass(frozen=True)
class ClassParameter:
    """A positive parameter per class, learnt in log space after the kernels' θ.

    Attributes
    ----------
    attribute : str
        The fitted estimator's attribute that holds it (the others such are None).
    init : float
        Starting value.
    bounds : (float, float)
    """

    attribute: str
    init: float
    bounds: tuple


@dataclass(frozen=True)
class MultiClassModel:
    """A model as ``MultiClassGPC`` fits and predicts it.

    Attributes
    ----------
    label : str
        Its name in the literature, for messages.
    evidence : callable
        ``evidence(est, theta, X, y, eval_gradient, init)``: the fitted approximation at θ (a warm
        start from ``init``, a previous one), with ``eval_gradient`` also its log evidence's
        gradient in θ.  The approximation has ``log_evidence``, ``n_iter`` and ``converged``.
    predictive : callable
        ``predictive(est, X)``: the fitted estimator's class probabilities (m, l).
    per_class : ClassParameter or None
        The model's own hyperparameters, one per class.
    shared_kernel_only : bool
        It needs ``shared_kernel=True``.
    outliers : bool
        Its approximation holds ``outlier_probability`` (RMGPC eq. (21); zeros for SMGPC); without,
        ``outlier_probability_`` is zeros.
    warn_unconverged : callable or None
        ``warn_unconverged(est, X)``, called by ``fit`` when the final approximation is not
        converged (None: the inference warns itself).
    """

    label: str
    evidence: Callable
    predictive: Callable
    per_class: Optional[ClassParameter]
    shared_kernel_only: bool
    outliers: bool
    warn_unconverged: Optional[Callable]


MODELS = {
    "robust": MultiClassModel("RMGPC", partial(rmgpc.evidence, robust=True), rmgpc.predictive,
                              per_class=None, shared_kernel_only=False, outliers=True,
                              warn_unconverged=rmgpc.warn_unconverged),
    "standard": MultiClassModel("SMGPC", partial(rmgpc.evidence, robust=False), rmgpc.predictive,
                                per_class=ClassParameter("noise_", rmgpc.NOISE_INIT, rmgpc.NOISE_BOUNDS),
                                shared_kernel_only=False, outliers=True,
                                warn_unconverged=rmgpc.warn_unconverged),
    "heavy-tailed": MultiClassModel("HTPC", htpc.evidence, htpc.predictive,
                                    per_class=ClassParameter("scales_", htpc.SCALE_INIT, htpc.SCALE_BOUNDS),
                                    shared_kernel_only=True, outliers=False, warn_unconverged=None),
}
