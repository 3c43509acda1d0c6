"""Warnings and errors that gpc raises for numerical conditions of the methods themselves."""


class ConvergenceWarning(UserWarning):
    """An iterative method stopped at its iteration limit before meeting its tolerance."""


class NegativeVarianceError(ArithmeticError):
    """EP met a negative cavity (or site) variance and the policy is ``on_negative="raise"``.

    EP produces these by its nature with non-log-concave likelihoods such as the noisy threshold
    (PL paper, supplement).  ``index`` is the site being updated and ``cavity_variance`` the value met.
    """

    def __init__(self, index, cavity_variance, message=None):
        self.index = int(index)
        self.cavity_variance = float(cavity_variance)
        if message is None:
            message = (f"EP: negative cavity variance {self.cavity_variance:.6g} at site {self.index}; "
                       "use on_negative='clip' or 'skip', damping, or method='pl'")
        super().__init__(message)


class NotPositiveDefiniteError(ValueError, ArithmeticError):
    """A matrix that must be positive definite is not, even after adding jitter to its diagonal."""
