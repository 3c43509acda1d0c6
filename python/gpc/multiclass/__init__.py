"""Multi-class GP classification with l latent functions (RMGPC paper): EP for the robust model,
its SMGPC special case, prediction, the scikit-learn-style estimator ``MultiClassGPC`` over the
models of :mod:`gpc.multiclass.models` (RMGPC and SMGPC by EP, HTPC by Laplace), and its
inducing-point form for large n, ``SparseMultiClassGPC`` (scalable EP)."""

from .ep import MultiClassEPResult, rmgpc_ep
from .estimator import MultiClassGPC
from .sparse_estimator import SparseMultiClassGPC

__all__ = ["MultiClassGPC", "SparseMultiClassGPC", "rmgpc_ep", "MultiClassEPResult"]
