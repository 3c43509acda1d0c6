"""Binary likelihoods p(y | f), y in {-1, +1}, and the moments every inference method needs.

The numerical work is done in the Cython module ``gpc._likelihoods``; this module validates input,
names the likelihoods and carries their parameters.  Formulas: ``docs/derivations.md``, section
"Likelihood moments".  Paper references: PL = García-Fernández, Tronarp, Särkkä (posterior
linearisation), MF = Csató et al. (mean field), R&W = Rasmussen & Williams (2006).
"""

import numbers
from typing import Optional

import numpy as np

from . import _likelihoods as _core
# the kinds of the LikelihoodSpec contract, as gpc._likelihoods exports its enum
from ._likelihoods import LIK_HEAVISIDE, LIK_LOGIT, LIK_NOISY_THRESHOLD, LIK_PROBIT, LIK_PYTHON
from .exceptions import DivergenceError
from ._validation import check_finite_array

__all__ = ["Likelihood", "Probit", "Logit", "NoisyThreshold", "Heaviside", "get_likelihood"]


#: Default Gauss-Hermite order.  Measured against scipy.integrate.quad on the grid means in
#: [-5, 5], variances in [0.01, 1] (larger variances use a step + Gauss-Laguerre split for logit):
#: logit tilted moments are off by 2.6e-12 at order 32 and ~1e-13 (quad's own level) at 48.
DEFAULT_GH_ORDER = 48

_GH_CACHE: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _gauss_hermite(order):
    """Probabilists' Gauss-Hermite nodes and weights normalised to sum to 1 (cached, read-only)."""
    if order not in _GH_CACHE:
        x, w = np.polynomial.hermite_e.hermegauss(order)
        w = w / w.sum()
        x.setflags(write=False)
        w.setflags(write=False)
        _GH_CACHE[order] = (x, w)
    return _GH_CACHE[order]


def _check_gh_order(order):
    if not isinstance(order, numbers.Integral) or isinstance(order, bool) or not 2 <= order <= 200:
        raise ValueError(f"gh_order must be an integer in [2, 200], got {order!r}")
    return int(order)


def _as_vector(a, name):
    arr = check_finite_array(np.atleast_1d(a), name)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a scalar or 1-dimensional, got shape {arr.shape}")
    return arr


def _check_same_length(**arrays):
    lengths = {k: v.shape[0] for k, v in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError("arrays must have equal lengths, got "
                         + ", ".join(f"{k}: {n}" for k, n in lengths.items()))


def _check_labels(y):
    y = _as_vector(y, "y")
    if not np.all((y == 1.0) | (y == -1.0)):
        raise ValueError("y must hold labels -1 and +1 only")
    return y


def _check_variance(v, name):
    v = _as_vector(v, name)
    if np.any(v <= 0.0):
        raise ValueError(f"{name} must be > 0 everywhere (min {v.min():.6g})")
    return v


def _check_gaussian(y, mean, var, mean_name="mean", var_name="var"):
    """Checked (labels or None, means, variances > 0) of one length for a Gaussian-input member."""
    m = _as_vector(mean, mean_name)
    v = _check_variance(var, var_name)
    arrays = {mean_name: m, var_name: v}
    if y is not None:
        y = _check_labels(y)
        arrays = {"y": y, **arrays}
    _check_same_length(**arrays)
    return y, m, v


def _check_status(bad, what):
    if bad >= 0:   # a numerical failure on valid input: gpc.exceptions' policy, not a FloatingPointError
        raise DivergenceError(f"{what}: result not representable at index {bad} "
                              "(normaliser underflows or a moment is not finite)", index=bad)


class Likelihood:
    """Base class of the binary likelihoods p(y | f), y in {-1, +1}.

    Every member takes 1-d arrays (or scalars) and returns float arrays; the labels ``y`` come first
    in every member that takes them.

    The built-in subclasses set ``name``, ``kind`` (their code in the compiled LikelihoodSpec) and
    carry closed forms or tuned quadratures in gpc._likelihoods.  A user-defined likelihood
    subclasses this class and implements only

        ``log_prob(self, y, f)``: log p(y | f), vectorised over arrays y (labels -1, +1) and f of one
        shape,

    and inherits the rest by probabilists' Gauss-Hermite quadrature of order ``gh_order`` against
    N(f | m, v), f_k = m + sqrt(v) x_k:

    - tilted moments (EP, ADF): Z = sum_k w_k p(y | f_k), mean and variance of the weights
      w_k p(y | f_k) / Z over the f_k (R&W eq. (3.56)-(3.58));
    - SLR moments (PL eq. (15)-(16)): P = sum_k w_k p(+1 | f_k), E[y] = 2P - 1, Var[y] = 4 P (1 - P),
      Cov[f, E(y|f)] = sum_k w_k (f_k - m)(2 p(+1 | f_k) - 1);
    - E_q[log p] (KL, VB) and its derivatives by Stein's lemma, d/dm E[g] = E[g (f - m)] / v and
      d/dv E[g] = E[g ((f - m)^2 - v)] / (2 v^2), so no derivative of log p is needed;
    - the predictive probability sum_k w_k p(+1 | f_k) (R&W eq. (3.25)).

    Such a likelihood works with EP, PL, KL and online ADF (the sweeps call its Python methods site by
    site).  Laplace also needs ``log_prob_derivatives(y, f) -> (log p, d1, d2, d3)``.

    Parameters
    ----------
    gh_order : int, default=48
        Order of the probabilists' Gauss-Hermite rule used where no closed form exists.
    """

    name: Optional[str] = None
    kind: Optional[int] = None
    log_concave = True
    differentiable = True
    _instead_of_laplace = ""   # the methods to name when Laplace cannot be used (not differentiable)
    _param_names: tuple[str, ...] = ("gh_order",)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name") is None:
            cls.name = cls.__name__.lower()

    def __init__(self, gh_order=DEFAULT_GH_ORDER):
        self.gh_order = gh_order

    # -- scikit-learn style parameter protocol --------------------------------------------------
    def get_params(self, deep=True):
        """Constructor parameters as a dict (scikit-learn convention)."""
        return {k: getattr(self, k) for k in self._param_names}

    def set_params(self, **params):
        """Set constructor parameters; unknown names raise ValueError."""
        for k, v in params.items():
            if k not in self._param_names:
                raise ValueError(f"invalid parameter {k!r} for {type(self).__name__}; "
                                 f"valid: {', '.join(self._param_names)}")
            setattr(self, k, v)
        return self

    def __repr__(self):
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._param_names)
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self.get_params() == other.get_params()

    def __hash__(self):
        return hash((type(self).__name__,) + tuple(self.get_params().values()))

    # -- C contract ------------------------------------------------------------------------------
    def _eps(self):
        return 0.0

    @property
    def is_compiled(self):
        """True for the built-in likelihoods, whose maths is compiled in gpc._likelihoods."""
        return self.kind is not None

    def compiled_spec(self):
        """``(kind, eps, gh_nodes, gh_weights, py_likelihood)``: the arguments from which the
        compiled engines build a LikelihoodSpec.  A user-defined likelihood is kind LIK_PYTHON with
        itself as ``py_likelihood`` (its Python methods are then called site by site)."""
        x, w = _gauss_hermite(_check_gh_order(self.gh_order))
        if self.is_compiled:
            return self.kind, self._eps(), x, w, None
        return LIK_PYTHON, 0.0, x, w, self

    def _core_args(self):
        return self.compiled_spec()[:4]

    def _compiled(self, core_fn, what, *arrays):
        """``core_fn(spec..., *arrays)`` of gpc._likelihoods; an error names the first failing index."""
        *out, bad = core_fn(*self._core_args(), *arrays)
        _check_status(bad, f"{self.name}.{what}")
        return tuple(out) if len(out) > 1 else out[0]

    def _nodes(self, mean, var):
        """Quadrature points f_k = m + sqrt(v) x_k (rows: data) and the weights w_k."""
        x, w = _gauss_hermite(_check_gh_order(self.gh_order))
        return mean[:, None] + np.sqrt(var)[:, None] * x[None, :], w

    def _log_prob_at(self, y, f):
        """log p(y_i | f_ik) on the quadrature grid f (rows: data)."""
        yy = np.broadcast_to(np.asarray(y, dtype=float)[:, None], f.shape)
        return np.asarray(self.log_prob(yy.ravel(), f.ravel()), dtype=float).reshape(f.shape)

    # -- public methods --------------------------------------------------------------------------
    def log_prob(self, y, f):
        """log p(y | f) elementwise (PL eq. (1)-(3)); -inf where p = 0 (noise-free step)."""
        y = _check_labels(y)
        f = _as_vector(f, "f")
        _check_same_length(y=y, f=f)
        if not self.is_compiled:
            raise NotImplementedError(f"{type(self).__name__} must implement log_prob(y, f)")
        return _core.log_prob_vec(*self._core_args(), y, f)

    def log_prob_derivatives(self, y, f):
        """log p(y|f) and its first three derivatives in f (Laplace; R&W §3.4, Alg. 3.1, 5.1).

        Returns
        -------
        log_p, d1, d2, d3 : ndarray
        """
        y = _check_labels(y)
        f = _as_vector(f, "f")
        _check_same_length(y=y, f=f)
        if not self.is_compiled:
            raise ValueError(f"{self.name}: Laplace needs log_prob_derivatives(y, f), which this "
                             "likelihood does not implement; use EP, PL, KL or online")
        if not self.differentiable:
            raise ValueError(f"{self.name}: the gradient of log p(y|f) is zero almost everywhere, so the "
                             f"Laplace approximation cannot be used (PL §I); use {self._instead_of_laplace}")
        return self._compiled(_core.log_prob_derivatives_vec, "log_prob_derivatives", y, f)

    def tilted_moments(self, y, cav_mean, cav_var):
        """Moments of p(y|f) N(f | cav_mean, cav_var) / Z (EP, ADF; R&W eq. (3.58), MF).

        Returns
        -------
        log_z, mean, var : ndarray
        """
        y, m, v = _check_gaussian(y, cav_mean, cav_var, "cav_mean", "cav_var")
        if self.is_compiled:
            return self._compiled(_core.tilted_moments_vec, "tilted_moments", y, m, v)
        f, w = self._nodes(m, v)
        terms = np.log(w)[None, :] + self._log_prob_at(y, f)      # in log space: no underflow
        top = terms.max(axis=1, keepdims=True)
        if not np.all(np.isfinite(top)):
            _check_status(int(np.flatnonzero(~np.isfinite(top[:, 0]))[0]), f"{self.name}.tilted_moments")
        p = np.exp(terms - top)
        z = p.sum(axis=1)
        mean = (p * f).sum(axis=1) / z
        var = (p * (f - mean[:, None]) ** 2).sum(axis=1) / z
        return np.log(z) + top[:, 0], mean, var

    def log_tilted_normaliser(self, y, cav_mean, cav_var):
        """log Z = log ∫ p(y|f) N(f | cav_mean, cav_var) df, −inf where Z underflows.

        What an evidence needs from :meth:`tilted_moments` (EP's log Z_i): a label that a confident
        cavity contradicts has Z = 0 to double precision, a legitimate value here, where the moments
        of its tilted distribution do not exist (and :meth:`tilted_moments` raises).

        Parameters
        ----------
        y : array-like (n,)
            Labels -1, +1.
        cav_mean : array-like (n,)
            Means of the cavity distributions.
        cav_var : array-like (n,)
            Their variances, > 0.

        Returns
        -------
        log_z : ndarray (n,)
        """
        y, m, v = _check_gaussian(y, cav_mean, cav_var, "cav_mean", "cav_var")
        log_z = np.full(len(y), -np.inf)
        start = 0
        while start < len(y):
            # the first entry whose Z underflows stops a vectorised call: it stays −inf, and the
            # rest is evaluated again from the next entry (rare: once per such entry)
            part, bad = self._log_z_until_failure(y[start:], m[start:], v[start:])
            stop = len(y) if bad < 0 else start + bad
            log_z[start:stop] = part[: stop - start]
            start = stop + 1
        return log_z

    def _log_z_until_failure(self, y, m, v):
        """(log Z, index of the first entry whose Z underflows or −1); entries from it are unset."""
        if self.is_compiled:
            log_z, _, _, bad = _core.tilted_moments_vec(*self._core_args(), y, m, v)
            return log_z, bad
        f, w = self._nodes(m, v)
        terms = np.log(w)[None, :] + self._log_prob_at(y, f)
        top = terms.max(axis=1)
        failed = np.flatnonzero(~np.isfinite(top))
        safe = np.where(np.isfinite(top), top, 0.0)
        with np.errstate(divide="ignore"):          # log 0 = −inf at the failed entries
            log_z = np.log(np.exp(terms - safe[:, None]).sum(axis=1)) + safe
        return log_z, (int(failed[0]) if failed.size else -1)

    def slr_moments(self, mean, var):
        """SLR moments of the label for f ~ N(mean, var) (PL eq. (15)-(16) and supplement).

        Returns
        -------
        mu_y : ndarray
            E[E(y|f)], with E(y|f) = 2 p(+1|f) - 1.
        cov_fy : ndarray
            Cov[f, E(y|f)].
        var_y : ndarray
            Var[y] = 1 - mu_y**2 (labels in {-1, +1}; the supplement's "1 - alpha^2" is read as
            1 - (2 alpha - 1)^2, see docs/derivations.md).
        """
        _, m, v = _check_gaussian(None, mean, var)
        if self.is_compiled:
            return self._compiled(_core.slr_moments_vec, "slr_moments", m, v)
        f, w = self._nodes(m, v)
        p_plus = np.exp(self._log_prob_at(np.ones_like(m), f))
        P = p_plus @ w
        cov = ((f - m[:, None]) * (2.0 * p_plus - 1.0)) @ w
        return 2.0 * P - 1.0, cov, 4.0 * P * (1.0 - P)

    def expected_log_prob(self, y, mean, var):
        """E_q[log p(y|f)] for q = N(mean, var) and its derivatives in mean and var (KL, SVI).

        Returns
        -------
        e, de_dmean, de_dvar : ndarray
        """
        y, m, v = _check_gaussian(y, mean, var)
        if self.is_compiled:
            return self._compiled(_core.expected_log_prob_vec, "expected_log_prob", y, m, v)
        f, w = self._nodes(m, v)
        lp = self._log_prob_at(y, f)
        d = f - m[:, None]
        return lp @ w, (lp * d) @ w / v, (lp * (d * d - v[:, None])) @ w / (2.0 * v * v)

    def predictive_probability(self, mean, var):
        """P(y = +1) = int p(+1|f) N(f | mean, var) df (R&W eq. (3.25)); var > 0."""
        _, m, v = _check_gaussian(None, mean, var)
        if self.is_compiled:
            return self._compiled(_core.predictive_probability_vec, "predictive_probability", m, v)
        f, w = self._nodes(m, v)
        return np.exp(self._log_prob_at(np.ones_like(m), f)) @ w


class Probit(Likelihood):
    """Probit likelihood p(y | f) = Phi(y f) (PL eq. (1)).

    Log-concave; tilted moments, SLR moments and predictive probability in closed form
    (R&W eq. (3.58), (3.82); PL supplement).  ``expected_log_prob`` uses Gauss-Hermite.

    Parameters
    ----------
    gh_order : int, default=48
        Gauss-Hermite order for ``expected_log_prob``.
    """

    name = "probit"
    kind = LIK_PROBIT


class Logit(Likelihood):
    """Logistic likelihood p(y | f) = 1 / (1 + exp(-y f)) (PL eq. (2)).

    No closed forms: Gauss-Hermite in log space for variances <= 1, and for larger variances an
    exact split sigma = H + (sigma - H) with the step in closed form and the remainder by
    Gauss-Laguerre (docs/derivations.md), because Gauss-Hermite alone loses 2-3 digits at
    variance 100.

    Parameters
    ----------
    gh_order : int, default=48
        Gauss-Hermite order (measured error ~1e-13 against quad for variances <= 1).
    """

    name = "logit"
    kind = LIK_LOGIT


class NoisyThreshold(Likelihood):
    """Noisy threshold p(y | f) = eps + (1 - 2 eps) H(y f) (PL eq. (3)).

    Not log-concave (EP may produce negative site variances, PL supplement), and its gradient is
    zero almost everywhere, so Laplace cannot be used (PL §I).  All moments in closed form.

    Parameters
    ----------
    eps : float, default=0.01
        Label-flip probability, in (0, 0.5).
    gh_order : int, default=48
        Unused by the closed forms; kept for a uniform interface.
    """

    name = "noisy_threshold"
    kind = LIK_NOISY_THRESHOLD
    log_concave = False
    differentiable = False
    _instead_of_laplace = "EP, PL or ADF"
    _param_names = ("eps", "gh_order")

    def __init__(self, eps=0.01, gh_order=DEFAULT_GH_ORDER):
        self.eps = eps
        self.gh_order = gh_order

    def _eps(self):
        eps = self.eps
        ok = isinstance(eps, numbers.Real) and not isinstance(eps, bool) and 0.0 < eps < 0.5
        if not ok:
            raise ValueError(f"eps must be a number in (0, 0.5), got {eps!r}")
        return float(eps)


class Heaviside(Likelihood):
    """Noise-free step p(y | f) = H(y f) (the eps = 0 case of PL eq. (3); MF paper).

    All moments in closed form; ``expected_log_prob`` is undefined (log 0) and raises.

    Parameters
    ----------
    gh_order : int, default=48
        Unused by the closed forms; kept for a uniform interface.
    """

    name = "heaviside"
    kind = LIK_HEAVISIDE
    log_concave = False
    differentiable = False
    _instead_of_laplace = "EP or ADF"   # PL collapses on a step (PL §I)

    def expected_log_prob(self, y, mean, var):
        raise ValueError("heaviside: E_q[log p(y|f)] is -inf (log 0 on the wrong side of the "
                         "step); use NoisyThreshold(eps) for KL/SVI")


_BY_NAME = {cls.name: cls for cls in (Probit, Logit, NoisyThreshold, Heaviside)}


def get_likelihood(spec):
    """Resolve a likelihood instance or a case-insensitive name to a Likelihood instance.

    Parameters
    ----------
    spec : Likelihood or str
        One of "probit", "logit", "noisy_threshold", "heaviside", or an instance.
    """
    if isinstance(spec, Likelihood):
        return spec
    if isinstance(spec, str) and spec.lower() in _BY_NAME:
        return _BY_NAME[spec.lower()]()
    raise ValueError(f"unknown likelihood {spec!r}; allowed names: {', '.join(_BY_NAME)} "
                     "(or a gpc.likelihoods.Likelihood instance)")
