"""Adaptive damping of the parallel site schedule.

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

**Rounding is not oscillation.**  Once the iterates reach the rounding floor of the update (the
marginals come from a factorisation of B, whose rounding error is relative to the iterates' size and
amplified by B's condition), the steps are rounding noise, and the floating-point map often settles
into an exact two-cycle there: a step and its reverse, which the test above reads as an oscillation.
Halving η does not move that floor (it is a floor of F, and the convergence test divides the change
by η): a tolerance below it would end, after ten halvings, in a DivergenceError.  Before it
halves for an oscillation (or after ``STALL`` sweeps without a new smallest residual), the schedule
measures the rounding level of F at the current sites (``probe``): F evaluated afresh at the sites
and at the sites moved by a few units in the last place, both from new factorisations; the
difference of the two is rounding (plus a Jacobian term of the size of the move, which is negligible).
A residual within ``ROUNDING_MARGIN`` times that level is rounding: the schedule stops there as
converged, and the result's ``info["rounding_floor"]`` records the sweep, the residual and the
rounding level (the requested ``tol`` was below what float64 resolves for this problem).  A real
two-cycle is larger than the rounding level and still halves η.
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
#: a residual within this multiple of the measured rounding level of the update is rounding
ROUNDING_MARGIN = 8.0
#: sweeps without a new smallest residual after which the rounding level is measured
STALL = 25
#: returned by :meth:`AdaptiveDamping.observe` when the iterates sit at the rounding floor
AT_ROUNDING_FLOOR = "rounding floor"


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
        self._stalled = 0           # sweeps since the smallest residual last fell
        self.floor = None           # where the iterates were found at the rounding floor

    @property
    def adaptive(self):
        return self.min_damping is not None

    def observe(self, sweep, tau, nu, new_tau, new_nu, probe=None):
        """Record the step of an accepted sweep from the sites (τ, ν).

        ``probe(τ, ν)``, if given, returns the rounding level of the undamped update at the sites
        (τ, ν) in the scale of the residual (module docstring).  Returns None to go on, the sites
        (τ, ν) to restart from after a halving, or ``AT_ROUNDING_FLOOR`` when the step is rounding
        (``self.floor`` then holds the sweep, the residual and the rounding level).
        """
        if not self.adaptive:
            return None
        scale = _scale(tau, nu)
        raw = np.concatenate([new_tau - tau, new_nu - nu])
        step = scale * raw
        residual = np.linalg.norm(step) / self.damping      # ‖F(x) − x‖: the same for every η
        self._stalled += 1
        if self._best is None or residual < self._best[0]:
            self._best = (residual, tau.copy(), nu.copy())
            self._stalled = 0
        last, self._last_step = self._last_step, raw
        if residual > GROWTH * max(self._best[0], RESIDUAL_FLOOR):
            return self._restart(sweep, f"the parallel updates diverge (residual {residual:.3g}, "
                                        f"{residual / self._best[0]:.3g} times the smallest)")
        if probe is not None and self._stalled >= STALL:
            self._stalled = 0
            if self._at_floor(sweep, residual, probe(tau, nu)):
                return AT_ROUNDING_FLOOR
        if last is None:
            return None
        # both steps in the scale of the current sites: a two-cycle x_a → x_b → x_a has
        # d_k = −d_{k−1} exactly, which the scale of each step's own starting point would distort
        # (a site swinging between 0 and 10 is a step of 10 from one end and of 0.9 from the other)
        last = scale * last
        na, nb = np.linalg.norm(step), np.linalg.norm(last)
        if na == 0.0 or nb == 0.0:
            self._strikes = 0
            return None
        oscillating = (step @ last) / (na * nb) < OSCILLATION_COSINE and na > SHRINK * nb
        self._strikes = self._strikes + 1 if oscillating else 0
        if self._strikes >= PATIENCE:
            if probe is not None and self._at_floor(sweep, residual, probe(tau, nu)):
                return AT_ROUNDING_FLOOR
            return self._restart(sweep, "the parallel updates oscillate")
        return None

    def _at_floor(self, sweep, residual, rounding):
        """Whether ``residual`` is within ROUNDING_MARGIN of the rounding level; records it."""
        if not residual <= ROUNDING_MARGIN * rounding:
            return False
        self.floor = {"sweep": int(sweep), "residual": float(residual), "rounding_level": float(rounding)}
        return True

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
        """What the result records: the final η, every halving as (sweep, new η) and, if the run
        stopped at the rounding floor, ``rounding_floor`` (sweep, residual, rounding level)."""
        out = {"damping": self.damping, "damping_halved_at": list(self.halved_at)}
        if self.floor is not None:
            out["rounding_floor"] = dict(self.floor)
        return out


def _scale(tau, nu):
    """The weights 1/(1 + |site|) of the residual, as the convergence test measures a change."""
    return np.concatenate([1.0 / (1.0 + np.abs(tau)), 1.0 / (1.0 + np.abs(nu))])


def rounding_level(update, tau, nu, ulps=16.0, seed=0):
    """The rounding level of an undamped update F at the sites (τ, ν), in the residual's scale.

    ``update(τ, ν)`` returns F(τ, ν) = the matched sites, computed afresh (its own factorisation).
    F is evaluated at (τ, ν) and at the sites moved by up to ``ulps`` units in the last place
    (seeded, so a run is repeatable); ‖scale · (F(x') − F(x))‖ is the rounding noise of F (two
    independent roundings) plus J (x' − x), of the size of the move.
    """
    rng = np.random.default_rng(seed)
    u = np.finfo(np.float64).eps
    tau1 = tau * (1.0 + ulps * u * rng.uniform(-1.0, 1.0, tau.shape))
    nu1 = nu * (1.0 + ulps * u * rng.uniform(-1.0, 1.0, nu.shape))
    f_tau0, f_nu0 = update(tau, nu)
    f_tau1, f_nu1 = update(tau1, nu1)
    return float(np.linalg.norm(_scale(tau, nu) * np.concatenate([f_tau1 - f_tau0, f_nu1 - f_nu0])))


def check_min_damping(min_damping, damping):
    """None, or a floor in (0, damping]."""
    if min_damping is None:
        return None
    if not (isinstance(min_damping, (int, float)) and 0.0 < min_damping <= damping):
        raise ValueError(f"min_damping must be None or a number in (0, damping={damping:g}], "
                         f"got {min_damping!r}")
    return float(min_damping)
