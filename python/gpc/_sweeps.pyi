# Type stub of the compiled module gpc._sweeps (src/gpc_core/_sweeps.pyx): its functions take and return
# NumPy arrays and are checked at their entry points; typed here as Any.
from typing import Any

def __getattr__(name: str) -> Any: ...

# sequential_sweep's status for an update that would make the posterior indefinite
SWEEP_INDEFINITE: int
