# Type stub of the compiled module gpc._kernels (src/gpc_core/_kernels.pyx): its functions take and return
# NumPy arrays and are checked at their entry points; typed here as Any.
from typing import Any

def __getattr__(name: str) -> Any: ...

# the kinds (cpdef enum)
RBF: int
MATERN12: int
MATERN32: int
MATERN52: int
