"""Warnings and errors that gpc raises, and the policy they follow.

Exception policy (every public entry point: :func:`gpc.infer`, the estimator's ``fit``,
``predict``, ``predict_proba``, ``log_marginal_likelihood``):

- Bad input (wrong shape, type, labels, non-finite values, an option out of range, a kernel matrix
  that is not positive definite) raises ``ValueError`` or ``TypeError`` with a message naming the
  problem.
- A numerical failure that a method can meet by its nature on valid input raises a subclass of
  :class:`NumericalError`, which names the method, the site (0-based index, or None when the failure
  is not tied to one datum) and the offending value.  :class:`NegativeVarianceError` (EP with a
  non-log-concave likelihood) is one of them.
- Nothing else escapes: no ``FloatingPointError``, no bare ``ArithmeticError``, no
  ``numpy.linalg.LinAlgError``.
- Non-convergence (the iteration limit reached before the tolerance) emits a
  :class:`ConvergenceWarning` and returns the last iterate, which is still a valid approximation:
  finite, with non-negative variances and, where the method's evidence is a probability of the
  labels, a log evidence ≤ 0.  A method that cannot return such a value raises a
  :class:`NumericalError` instead.
"""


class ConvergenceWarning(UserWarning):
    """An iterative method stopped at its iteration limit before meeting its tolerance."""


class NumericalError(ArithmeticError):
    """A method met a numerical failure on valid input (base class of gpc's numerical errors).

    Parameters
    ----------
    message : str
        What failed, naming the method, the site and the value.
    method : str or None, default=None
        The inference method ("ep", "pl", "online", ...).
    index : int or None, default=None
        The 0-based site (datum) at which it failed, or None when no single site is to blame.
    value : float or None, default=None
        The offending value (a variance, a site precision, a log evidence, ...).

    Attributes
    ----------
    method : str or None
        The inference method ("ep", "pl", "online", ...).
    index : int or None
        The 0-based site (datum) at which it failed, or None when no single site is to blame.
    value : float or None
        The offending value (a variance, a site precision, a log evidence, ...).
    """

    def __init__(self, message, method=None, index=None, value=None):
        self.method = None if method is None else str(method)
        self.index = None if index is None else int(index)
        self.value = None if value is None else float(value)
        super().__init__(message)


class NegativeVarianceError(NumericalError):
    """EP met a negative cavity (or site) variance and the policy is ``on_negative="raise"``.

    EP produces these by its nature with non-log-concave likelihoods such as the noisy threshold
    (PL paper, supplement).  ``index`` is the (0-based) site being updated and ``cavity_variance`` its
    cavity variance: negative when the cavity is the problem; positive, with ``site_variance``
    negative, when the moment-matched site is.  ``value`` is the negative variance.

    Parameters
    ----------
    index : int
        The (0-based) site being updated.
    cavity_variance : float
        Its cavity variance.
    site_variance : float or None, default=None
        The moment-matched site variance, when it is the negative one.
    message : str or None, default=None
        The error message; by default it names the variance, the site and the remedies.
    method : str, default="ep"
        The method whose site update failed.
    """

    def __init__(self, index, cavity_variance, site_variance=None, message=None, method="ep"):
        self.cavity_variance = float(cavity_variance)
        self.site_variance = None if site_variance is None else float(site_variance)
        if message is None:
            if self.site_variance is None:
                what = f"negative cavity variance {self.cavity_variance:.6g}"
            else:
                what = (f"negative site variance {self.site_variance:.6g} (cavity variance "
                        f"{self.cavity_variance:.6g})")
            message = (f"{str(method).upper()}: {what} at site {int(index)}; use on_negative='keep' "
                       "(EP's default: negative sites kept, a site without a cavity falls back), "
                       "damping, or method='pl'")
        value = self.cavity_variance if self.site_variance is None else self.site_variance
        super().__init__(message, method=method, index=index, value=value)


class DivergenceError(NumericalError):
    """An iteration left the region where its quantities are finite (a site precision or a moment
    overflowed, an evidence became impossible) and no step back could repair it.

    Parameters
    ----------
    message : str
        What failed, naming the method, the site and the value.
    method : str or None, default=None
        The inference method ("ep", "pl", "online", ...).
    index : int or None, default=None
        The 0-based site (datum) at which it failed, or None when no single site is to blame.
    value : float or None, default=None
        The offending value (a variance, a site precision, a log evidence, ...).
    """


class NotPositiveDefiniteError(ValueError, ArithmeticError):
    """A matrix that must be positive definite is not, even after adding jitter to its diagonal.

    Raised for the caller's kernel matrix (bad input, hence a ``ValueError``).
    """
