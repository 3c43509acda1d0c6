"""Multi-class GP classification with l latent functions (RMGPC paper): EP for the robust model,
its SMGPC special case, prediction, and the scikit-learn-style estimator ``MultiClassGPC``."""

from .ep import MultiClassEPResult, rmgpc_ep
from .estimator import MultiClassGPC

__all__ = ["MultiClassGPC", "rmgpc_ep", "MultiClassEPResult"]
