# Type stub of the compiled module gpc._site_rule (src/gpc_core/_site_rule.pyx): its functions take and return
# NumPy arrays and are checked at their entry points; typed here as Any.
from typing import Any

def __getattr__(name: str) -> Any: ...

# the codes of gpc/_site_rule.pxd (cpdef enums), and the rules and policies by name
RULE_EP: int
RULE_PL: int
NEG_RAISE: int
NEG_CLIP: int
NEG_SKIP: int
NEG_PL: int
NEG_KEEP: int
NEG_KEEP_SKIP: int
SITE_UPDATED: int
SITE_NEGATIVE_CAVITY: int
SITE_LIKELIHOOD_FAILED: int
SITE_KEPT: int
SITE_FIXED: int
RULES: dict[str, int]
ON_NEGATIVE: dict[str, int]
