"""Binary likelihoods p(y | f), y ∈ {−1, +1}, and the per-datum integrals the methods need.

=================  ==============================  ===================================
likelihood         p(y | f)                        integrals
=================  ==============================  ===================================
``Probit()``       Φ(y f)            (PL eq. (1))  closed form (GH for E[log p])
``Logit()``        1 / (1 + e^{−y f}) (PL eq. (2)) Gauss–Hermite of order ``gh_order``
``NoisyThreshold`` ε + (1 − 2ε) H(y f) (PL eq. (3)) closed form
``Heaviside()``    H(y f)        (ε = 0; MF paper)  closed form
=================  ==============================  ===================================

Every method here is vectorised over data points and runs in the compiled core (``gpc._likelihoods``);
the formulas are in ``docs/derivations.md``.  Gauss–Hermite uses probabilists' nodes with weights
normalised to one: E[g(f)] ≈ Σ_k w_k g(m + √v x_k).
"""

import numpy as np
from numpy.polynomial.hermite_e import hermegauss

from . import _likelihoods as _core

PROBIT, LOGIT, NOISY_THRESHOLD, HEAVISIDE = 0, 1, 2, 3

#: default Gauss–Hermite order: the logit tilted moments are then within 1e-6 (relative, log Z and
#: variance) of adaptive quadrature for cavity variances up to 10 and 1e-3 up to 100 (tests)
DEFAULT_GH_ORDER = 64

_GH_CACHE = {}


def gauss_hermite(order):
    """Probabilists' Gauss–Hermite nodes and weights normalised to sum to one (cached)."""
    if order not in _GH_CACHE:
        x, w = hermegauss(order)
        _GH_CACHE[order] = (np.ascontiguousarray(x), np.ascontiguousarray(w / w.sum()))
    return _GH_CACHE[order]


def _vec(a, name):
    arr = np.ascontiguousarray(a, dtype=np.float64)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-dimensional, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def _labels(y):
    y = _vec(y, "y")
    if not np.all((y == 1.0) | (y == -1.0)):
        raise ValueError("y must hold labels -1 and +1 only")
    return y


def _same_length(*arrays):
    n = arrays[0].shape[0]
    for a in arrays[1:]:
        if a.shape[0] != n:
            raise ValueError(f"arrays have different lengths: {[b.shape[0] for b in arrays]}")
    return n


class Likelihood:
    """Base class: a binary likelihood with the integrals of Laplace, EP, PL, KL/VB and prediction."""

    name = "likelihood"
    kind = -1
    log_concave = True
    differentiable = True

    def __init__(self, gh_order=DEFAULT_GH_ORDER):
        if not isinstance(gh_order, (int, np.integer)) or isinstance(gh_order, bool) or gh_order < 2:
            raise ValueError(f"gh_order must be an integer >= 2, got {gh_order!r}")
        self.gh_order = int(gh_order)

    # -- scikit-learn style parameters (the estimator clones its likelihood) --------------------
    def get_params(self, deep=True):
        return {"gh_order": self.gh_order}

    def set_params(self, **params):
        for key, value in params.items():
            if key not in self.get_params():
                raise ValueError(f"invalid parameter {key!r} for {type(self).__name__}")
            setattr(self, key, value)
        self.__init__(**self.get_params())
        return self

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self.get_params() == other.get_params()

    def __hash__(self):
        return hash((type(self).__name__, tuple(sorted(self.get_params().items()))))

    @property
    def eps(self):
        return 0.0

    def _spec_args(self):
        """(kind, eps, gh_nodes, gh_weights) for building a LikelihoodSpec in C."""
        x, w = gauss_hermite(self.gh_order)
        return self.kind, float(self.eps), x, w

    # -- the integrals ---------------------------------------------------------------------------
    def log_prob(self, y, f):
        """log p(y | f), elementwise."""
        return self.log_prob_derivatives(y, f)[0]

    def log_prob_derivatives(self, y, f):
        """log p(y|f) and its first, second and third derivatives in f (Laplace; R&W Alg. 5.1)."""
        raise ValueError(
            f"the {self.name} likelihood has zero gradient almost everywhere (PL paper, §I), so "
            "methods that need derivatives of log p (Laplace) cannot use it; use EP or PL")

    def tilted_moments(self, y, cav_mean, cav_var):
        """log Z, mean and variance of p(y|f) N(f | cav_mean, cav_var) / Z (EP, ADF).

        Raises ValueError for a non-positive cavity variance or where Z underflows to zero.
        """
        y, m, v = _labels(y), _vec(cav_mean, "cav_mean"), _vec(cav_var, "cav_var")
        n = _same_length(y, m, v)
        if np.any(v <= 0):
            raise ValueError("cavity variances must be positive")
        out = [np.empty(n) for _ in range(3)]
        bad = _core.tilted_moments_into(*self._spec_args(), y, m, v, *out)
        if bad >= 0:
            raise ValueError(f"{self.name}: tilted distribution not representable at index {bad} "
                             f"(mean {m[bad]:.6g}, variance {v[bad]:.6g}): Z underflows to 0")
        return tuple(out)

    def slr_moments(self, mean, var):
        """Moments of the label for f ~ N(mean, var) (PL eq. (15)-(16), supplement).

        Returns (mu_y, cov_fy, var_y): E[E(y|f)], Cov[f, E(y|f)] and Var[y] = 1 − mu_y².
        """
        m, v = _vec(mean, "mean"), _vec(var, "var")
        n = _same_length(m, v)
        if np.any(v <= 0):
            raise ValueError("variances must be positive")
        out = [np.empty(n) for _ in range(3)]
        _core.slr_moments_into(*self._spec_args(), m, v, *out)
        return tuple(out)

    def expected_log_prob(self, y, mean, var):
        """E[log p(y|f)] for f ~ N(mean, var), with its derivatives in mean and in var (KL, SVI)."""
        y, m, v = _labels(y), _vec(mean, "mean"), _vec(var, "var")
        n = _same_length(y, m, v)
        if np.any(v <= 0):
            raise ValueError("variances must be positive")
        out = [np.empty(n) for _ in range(3)]
        bad = _core.expected_log_prob_into(*self._spec_args(), y, m, v, *out)
        if bad >= 0:
            raise ValueError(f"E[log p] is -inf for the {self.name} likelihood")
        return tuple(out)

    def predictive_probability(self, mean, var):
        """P(y = +1) = ∫ p(+1 | f) N(f | mean, var) df (closed form for probit and the steps)."""
        m, v = _vec(mean, "mean"), _vec(var, "var")
        n = _same_length(m, v)
        if np.any(v < 0):
            raise ValueError("variances must be non-negative")
        out = np.empty(n)
        _core.predictive_positive_into(*self._spec_args(), m, v, out)
        return out


class _Differentiable(Likelihood):
    def log_prob_derivatives(self, y, f):
        y, f = _labels(y), _vec(f, "f")
        n = _same_length(y, f)
        out = [np.empty(n) for _ in range(4)]
        _core.log_prob_derivatives_into(self.kind, y, f, *out)
        return tuple(out)


class Probit(_Differentiable):
    """p(y | f) = Φ(y f) (PL eq. (1)).  Tilted and SLR moments in closed form (R&W eq. (3.58))."""

    name = "probit"
    kind = PROBIT


class Logit(_Differentiable):
    """p(y | f) = 1 / (1 + exp(−y f)) (PL eq. (2)).  Integrals by Gauss–Hermite of order ``gh_order``."""

    name = "logit"
    kind = LOGIT


class NoisyThreshold(Likelihood):
    """p(y | f) = ε + (1 − 2ε) H(y f) (PL eq. (3)), 0 < ε < ½.  Not log-concave; zero gradient a.e."""

    name = "noisy_threshold"
    kind = NOISY_THRESHOLD
    log_concave = False
    differentiable = False

    def __init__(self, eps=0.1, gh_order=DEFAULT_GH_ORDER):
        eps = float(eps) if isinstance(eps, (int, float, np.floating)) and not isinstance(eps, bool) else eps
        if not isinstance(eps, float) or not (0.0 < eps < 0.5):
            raise ValueError(f"eps must be a number in (0, 0.5), got {eps!r}")
        self._eps = eps
        super().__init__(gh_order)

    @property
    def eps(self):
        return self._eps

    def get_params(self, deep=True):
        return {"eps": self._eps, "gh_order": self.gh_order}

    def set_params(self, **params):
        p = self.get_params()
        for key, value in params.items():
            if key not in p:
                raise ValueError(f"invalid parameter {key!r} for NoisyThreshold")
            p[key] = value
        self.__init__(**p)
        return self

    def log_prob(self, y, f):
        y, f = _labels(y), _vec(f, "f")
        _same_length(y, f)
        return np.where(y * f > 0, np.log1p(-self._eps), np.log(self._eps))


class Heaviside(Likelihood):
    """p(y | f) = H(y f): the noise-free step of the MF paper (the ε → 0 limit of NoisyThreshold)."""

    name = "heaviside"
    kind = HEAVISIDE
    differentiable = False

    def log_prob(self, y, f):
        y, f = _labels(y), _vec(f, "f")
        _same_length(y, f)
        return np.where(y * f > 0, 0.0, -np.inf)

    def expected_log_prob(self, y, mean, var):
        raise ValueError("E[log H(y f)] is -inf under any Gaussian: the heaviside likelihood has no "
                         "expected log-likelihood (use EP, ADF or mean field)")


_BY_NAME = {"probit": Probit, "logit": Logit, "noisy_threshold": NoisyThreshold, "heaviside": Heaviside}


def get_likelihood(spec):
    """A likelihood instance from an instance or a name (case-insensitive)."""
    if isinstance(spec, Likelihood):
        return spec
    if isinstance(spec, str) and spec.lower().replace("-", "_") in _BY_NAME:
        return _BY_NAME[spec.lower().replace("-", "_")]()
    raise ValueError(f"unknown likelihood {spec!r}; use one of {', '.join(_BY_NAME)} or an instance")


__all__ = ["Likelihood", "Probit", "Logit", "NoisyThreshold", "Heaviside", "get_likelihood",
           "gauss_hermite", "DEFAULT_GH_ORDER"]
