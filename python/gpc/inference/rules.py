"""How sites are refitted, for every EP and PL in gpc: the dense engine (``gpc.inference``) and the
sparse one (``gpc.sparse``).

``RULES`` names the site rules of ``gpc._site_rule`` (moment matching, "ep", or PL's statistical
linear regression, "pl") and ``ON_NEGATIVE`` the policies for a negative cavity or site variance
(``gpc.inference._sites`` says what each does), both name to code, as ``gpc._site_rule`` exports
them from its enums.
``DEFAULT_ON_NEGATIVE`` is EP's default policy, dense and sparse: negative site precisions kept,
PL's site where a site has no cavity.  ``Rule`` bundles a rule and a policy for the sparse passes.
"""

from dataclasses import dataclass

from .._site_rule import ON_NEGATIVE, RULES

DEFAULT_ON_NEGATIVE = "keep"


@dataclass(frozen=True)
class Rule:
    """How the sparse sites are refitted: ``method`` "ep" (moment matching) or "pl" (PL's
    statistical linear regression), and EP's policy ``on_negative`` for negative cavity or site
    variances ("raise", "clip", "skip", "pl", "keep", "keep-skip"; default the exact EP's).

    Both run the site rule of gpc._site_rule.
    """

    method: str = "ep"
    on_negative: str = DEFAULT_ON_NEGATIVE

    def __post_init__(self):
        if self.method not in RULES:
            raise ValueError(f"the sparse site rule must be one of {', '.join(RULES)}, got "
                             f"{self.method!r}")
        if self.on_negative not in ON_NEGATIVE:
            raise ValueError(f"on_negative must be one of {', '.join(ON_NEGATIVE)}, got "
                             f"{self.on_negative!r}")

    @property
    def codes(self):
        """(rule, on_negative) as the codes of gpc._site_rule."""
        return RULES[self.method], ON_NEGATIVE[self.on_negative]


#: EP with the default policy: the rule of a caller that names none
EP = Rule()
