# Type stub of the compiled module gpc._sparse_multiclass (src/gpc_core/_sparse_multiclass.pyx): its functions take and
# return NumPy arrays and are checked at their entry points; typed here as Any.
from typing import Any

def __getattr__(name: str) -> Any: ...
