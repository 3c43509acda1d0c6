# Type stub of the compiled module gpc._lapack (src/gpc_core/_lapack.pyx), the Python entry points
# of the compiled linear algebra (gpc/_blas.pxd): its functions take and return NumPy arrays and are
# checked at their entry points; typed here as Any.
from typing import Any

def __getattr__(name: str) -> Any: ...

def mirror_lower(A: Any, block: int = ...) -> Any: ...
