# Type stub of the compiled module gpc._sparse (src/gpc_core/_sparse.pyx): its functions take and
# return NumPy arrays and are checked at their entry points; typed here as Any.
from typing import Any

def __getattr__(name: str) -> Any: ...

# refine_block's ``sums`` (cpdef enum)
SUMS_NEW: int
SUMS_CHANGE: int
SUMS_SWAP: int
