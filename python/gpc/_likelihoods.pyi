# Type stub of the compiled module gpc._likelihoods (src/gpc_core/_likelihoods.pyx): its functions take and return
# NumPy arrays and are checked at their entry points; typed here as Any.
from typing import Any

def __getattr__(name: str) -> Any: ...

# the kinds of a LikelihoodSpec (the cpdef enum of gpc/_likelihoods.pxd)
LIK_PROBIT: int
LIK_LOGIT: int
LIK_NOISY_THRESHOLD: int
LIK_HEAVISIDE: int
LIK_PYTHON: int
