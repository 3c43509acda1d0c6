"""Adaptive damping of the parallel site schedule (issue 17, item 7).

A parallel sweep refits every site against one posterior and moves the natural parameters by
η × (matched − old) (RMGPC §3).  Near a fixed point this is the linear iteration x ← x + η (F(x) − x):
a mode of the Jacobian of F with eigenvalue λ < 0 is multiplied by 1 + η (λ − 1) per sweep, which
oscillates in sign and grows when λ < 1 − 2/η (undamped parallel EP and PL at a large prior
amplitude: crabs at σ² = e⁶).  Halving η brings every such factor towards 1 − η(1 − λ) ∈ (−1, 1),
so enough halvings make the iteration contract.  This is what the papers' own EP code does (halve
the damping when an update fails; RMGPC §3 on a covariance that is not positive definite); here an
oscillation is also a reason:

- **oscillation**: two sweeps running whose steps point back against the step before
  (cosine < ``OSCILLATION_COSINE``) without shrinking by half (‖d_k‖ > ``SHRINK`` ‖d_{k−1}‖), the
  steps measured relative to 1 + |site| as the convergence test does;
- **divergence**: the residual of the undamped update, r_k = ‖d_k‖/η, grows above ``GROWTH`` times
  the smallest residual met so far (and above ``RESIDUAL_FLOOR``, below which rounding decides);
- **failure**: an update whose posterior cannot be formed (B not positive definite, a non-finite
  marginal) or whose likelihood cannot be evaluated; the update is discarded.

Oscillation and divergence halve η and restart from the sites of the smallest residual so far (an
iteration that has wandered off is not continued from where it went); a failure halves η and
retries from the old sites.  Each halving is recorded as ``(sweep, η)`` and starts the counts
afresh.  The fixed point does not depend on η, only the path to it; the convergence test divides
the change of a sweep by η, so a small η does not pass for convergence.  When η would fall below
the floor the schedule stops with a :class:`~gpc.exceptions.DivergenceError`.  Damping is never
raised again within a run.
"""

import numpy as np

from ..exceptions import DivergenceError

#: the default floor: ten halvings from undamped
DEFAULT_MIN_DAMPING = 2.0 ** -10
#: a step against the previous one: cos(d_k, d_{k−1}) below this
OSCILLATION_COSINE = -0.5
#: ... that did not shrink below this fraction of the previous step
SHRINK = 0.5
#: ... for this many sweeps running
PATIENCE = 2
#: divergence: a residual above this multiple of the smallest one so far
GROWTH = 4.0
#: ... and above this (relative units of the convergence test; below it rounding decides)
RESIDUAL_FLOOR = 1e-6


class AdaptiveDamping:
    """The damping η of one parallel run and its halvings.

    Parameters
    ----------
    damping : float in (0, 1]
        The initial η.
    min_damping : float or None
        The floor; None keeps η fixed (the plain schedule of the papers, never halved).
    method : str
        Named in the DivergenceError ("ep", "pl").
    """

    def __init__(self, damping, min_damping, method):
        self.damping = float(damping)
        self.min_damping = None if min_damping is None else float(min_damping)
        self.method = method
        self.halved_at = []
        self._last_step = None
        self._strikes = 0
        self._best = None           # (residual, τ, ν) of the smallest residual so far

    @property
    def adaptive(self):
        return self.min_damping is not None

    def observe(self, sweep, tau, nu, new_tau, new_nu):
        """Record the step of an accepted sweep from the sites (τ, ν).

        Returns None to go on, or, after a halving, the sites (τ, ν) to restart from.
        """
        if not self.adaptive:
            return None
        scale = np.concatenate([1.0 / (1.0 + np.abs(tau)), 1.0 / (1.0 + np.abs(nu))])
        step = scale * np.concatenate([new_tau - tau, new_nu - nu])
        residual = np.linalg.norm(step) / self.damping      # ‖F(x) − x‖: the same for every η
        if self._best is None or residual < self._best[0]:
            self._best = (residual, tau.copy(), nu.copy())
        last, self._last_step = self._last_step, step
        if residual > GROWTH * max(self._best[0], RESIDUAL_FLOOR):
            return self._restart(sweep, f"the parallel updates diverge (residual {residual:.3g}, "
                                        f"{residual / self._best[0]:.3g} times the smallest)")
        if last is None:
            return None
        # the previous step in the same scale: the direction matters, not the sites' drift
        na, nb = np.linalg.norm(step), np.linalg.norm(last)
        if na == 0.0 or nb == 0.0:
            self._strikes = 0
            return None
        oscillating = (step @ last) / (na * nb) < OSCILLATION_COSINE and na > SHRINK * nb
        self._strikes = self._strikes + 1 if oscillating else 0
        if self._strikes >= PATIENCE:
            return self._restart(sweep, "the parallel updates oscillate")
        return None

    def _restart(self, sweep, reason):
        self.halve(sweep, reason)
        _, tau, nu = self._best
        return tau.copy(), nu.copy()

    def failed(self, sweep, reason):
        """An update could not be used: halve η (or raise if it is fixed or at its floor)."""
        if not self.adaptive:
            raise DivergenceError(f"{self.method.upper()} (parallel): {reason} at sweep {sweep} with "
                                  f"damping {self.damping:g}", method=self.method, value=self.damping)
        self.halve(sweep, reason)

    def halve(self, sweep, reason):
        new = 0.5 * self.damping
        if new < self.min_damping:
            raise DivergenceError(
                f"{self.method.upper()} (parallel): {reason} at sweep {sweep}, and halving the damping "
                f"again would take it to {new:.3g}, below min_damping={self.min_damping:g} (halved at "
                f"sweeps {[s for s, _ in self.halved_at]}); use the sequential schedule",
                method=self.method, value=new)
        self.damping = new
        self.halved_at.append((int(sweep), new))
        self._last_step = None
        self._strikes = 0

    def info(self):
        """What the result records: the final η and every halving as (sweep, new η)."""
        return {"damping": self.damping, "damping_halved_at": list(self.halved_at)}


def check_min_damping(min_damping, damping):
    """None, or a floor in (0, damping]."""
    if min_damping is None:
        return None
    if not (isinstance(min_damping, (int, float)) and 0.0 < min_damping <= damping):
        raise ValueError(f"min_damping must be None or a number in (0, damping={damping:g}], "
                         f"got {min_damping!r}")
    return float(min_damping)
