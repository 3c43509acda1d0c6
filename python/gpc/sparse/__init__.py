"""Sparse (inducing-point) GP classification for large n: SEP paper §2-§3.

>>> from gpc import SparseGaussianProcessClassifier
"""

from .estimator import SparseGaussianProcessClassifier

__all__ = ["SparseGaussianProcessClassifier"]
