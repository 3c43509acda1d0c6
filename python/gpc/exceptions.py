"""Warnings and errors that gpc raises for numerical conditions of the methods themselves."""


class ConvergenceWarning(UserWarning):
    """An iterative method stopped at its iteration limit before meeting its tolerance."""


class NegativeVarianceError(ArithmeticError):
    """EP met a negative cavity (or site) variance and the policy is ``on_negative="raise"``.

    EP produces these by its nature with non-log-concave likelihoods such as the noisy threshold
    (PL paper, supplement).  ``index`` is the (0-based) site being updated and ``cavity_variance`` its
    cavity variance: negative when the cavity is the problem; positive, with ``site_variance``
    negative, when the moment-matched site is.

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
    """

    def __init__(self, index, cavity_variance, site_variance=None, message=None):
        self.index = int(index)
        self.cavity_variance = float(cavity_variance)
        self.site_variance = None if site_variance is None else float(site_variance)
        if message is None:
            if self.site_variance is None:
                what = f"negative cavity variance {self.cavity_variance:.6g}"
            else:
                what = (f"negative site variance {self.site_variance:.6g} (cavity variance "
                        f"{self.cavity_variance:.6g})")
            message = (f"EP: {what} at site {self.index}; use on_negative='clip' or 'skip', damping, "
                       "or method='pl'")
        super().__init__(message)


class NotPositiveDefiniteError(ValueError, ArithmeticError):
    """A matrix that must be positive definite is not, even after adding jitter to its diagonal."""
