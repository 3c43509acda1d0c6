"""gpc: Gaussian process classification with every approximation of the papers under one API.

>>> from gpc import GaussianProcessClassifier, infer
>>> from gpc.kernels import RBF, ConstantKernel
>>> from gpc.likelihoods import Probit, Logit, NoisyThreshold, Heaviside
"""

from . import datasets, kernels, likelihoods
from .classifier import GaussianProcessClassifier
from .exceptions import (ConvergenceWarning, DivergenceError, NegativeVarianceError, NotPositiveDefiniteError,
                         NumericalError)
from .inference import InferenceResult, available_methods, infer
from .multiclass import MultiClassGPC, SparseMultiClassGPC
from .sparse import SparseGaussianProcessClassifier

__version__ = "0.1.0.dev0"

__all__ = [
    "GaussianProcessClassifier", "MultiClassGPC", "SparseGaussianProcessClassifier",
    "SparseMultiClassGPC", "infer",
    "available_methods", "InferenceResult",
    "ConvergenceWarning", "NumericalError", "NegativeVarianceError", "DivergenceError",
    "NotPositiveDefiniteError",
    "kernels", "likelihoods", "datasets",
]
