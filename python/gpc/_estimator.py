"""What every gpc estimator shares: input checks, the random state, ``n_jobs``, scikit-learn's base.

:class:`GPCEstimator` is the base of :class:`gpc.GaussianProcessClassifier`,
:class:`gpc.SparseGaussianProcessClassifier` and :class:`gpc.MultiClassGPC`.  When scikit-learn is
installed it derives from scikit-learn's ``ClassifierMixin`` and ``BaseEstimator`` (so ``clone``,
``check_estimator``, pipelines and grid search work unchanged); without it a small local base gives
``get_params`` / ``set_params``, ``__repr__`` and ``score``, and :class:`NotFittedError` and
:class:`DataConversionWarning` are gpc's own, with scikit-learn's bases.
"""

import functools
import inspect
import numbers
import warnings
from typing import Optional

import numpy as np
from numpy.typing import ArrayLike

from ._parallel import BLOCK_ROWS
from ._threads import available_cores, check_n_jobs, entry, resolve_n_jobs
from ._validation import check_finite_array

try:  # pragma: no branch
    from sklearn.base import BaseEstimator as _Base, ClassifierMixin as _ClassifierMixin
    from sklearn.exceptions import DataConversionWarning, NotFittedError
except ImportError:  # pragma: no cover - exercised only without scikit-learn

    class DataConversionWarning(UserWarning):  # type: ignore[no-redef]
        """A column-vector y was reshaped to 1-D."""

    class NotFittedError(ValueError, AttributeError):  # type: ignore[no-redef]
        """The estimator is used before ``fit``."""

    class _Base:  # type: ignore[no-redef]
        """get_params / set_params from the constructor's signature, as scikit-learn does."""

        @classmethod
        def _get_param_names(cls):
            sig = inspect.signature(cls.__init__)
            return sorted(p.name for p in sig.parameters.values() if p.name != "self")

        def get_params(self, deep=True):
            out = {}
            for name in self._get_param_names():
                value = getattr(self, name)
                if deep and hasattr(value, "get_params") and not isinstance(value, type):
                    out.update((f"{name}__{k}", v) for k, v in value.get_params().items())
                out[name] = value
            return out

        def set_params(self, **params):
            valid = self._get_param_names()
            for key, value in params.items():
                name, _, sub = key.partition("__")
                if name not in valid:
                    raise ValueError(f"invalid parameter {name!r} for {type(self).__name__}")
                if sub:
                    getattr(self, name).set_params(**{sub: value})
                else:
                    setattr(self, name, value)
            return self

        def __repr__(self):
            args = ", ".join(f"{k}={v!r}" for k, v in self.get_params(deep=False).items())
            return f"{type(self).__name__}({args})"

        def __getstate__(self):
            return dict(self.__dict__)

    class _ClassifierMixin:  # type: ignore[no-redef]
        def score(self, X, y, sample_weight=None):
            return float(np.average(self.predict(X) == np.asarray(y), weights=sample_weight))

__all__: list[str] = []

#: rows of the median heuristic's subsample
_MEDIAN_ROWS = 1_000


def as_rows(X, idx):
    """Rows ``idx`` (sorted) of any row-indexable array, as float64."""
    rows = X[idx]
    if hasattr(rows, "compute"):
        rows = rows.compute()
    return np.ascontiguousarray(rows, dtype=np.float64)


def _scale_of(S):
    """A power of two near the largest |entry| of S (1 for zeros): dividing by it is exact, and
    brings inputs of any magnitude to where their squares do not overflow."""
    top = float(np.max(np.abs(S))) if S.size else 0.0
    return float(2.0 ** np.round(np.log2(top))) if top > 0 else 1.0


def median_length_scale(X, rng):
    """The median distance between rows of a subsample (the median heuristic), 1.0 if it is 0."""
    idx = rng.choice(X.shape[0], size=min(X.shape[0], _MEDIAN_ROWS), replace=False)
    S = as_rows(X, np.sort(idx))
    scale = _scale_of(S)
    S = (S - S.mean(axis=0)) / scale
    sq = np.sum(S * S, axis=1)
    D2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * S @ S.T, 0.0)
    med = float(np.sqrt(np.median(D2[np.triu_indices(len(S), 1)]))) * scale if len(S) > 1 else 0.0
    return med if med > 0 else 1.0


# -- n_jobs: gpc._threads (available_cores, check_n_jobs, resolve_n_jobs) ---------------------
#: the public methods that run under the thread policy (gpc._threads.entry)
ENTRY_POINTS = ("fit", "partial_fit", "predict", "predict_proba", "predict_log_proba",
                "decision_function", "score", "log_marginal_likelihood", "outlier_probability",
                "predict_latent")


def _entry_point(method):
    """``method`` run inside the thread policy of its estimator's ``n_jobs``."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with entry(getattr(self, "n_jobs", None)):
            return method(self, *args, **kwargs)
    run.__wrapped_entry__ = True
    return run


# -- the random state -----------------------------------------------------------------------------
def random_generator(random_state):
    """A NumPy Generator or RandomState from an estimator's ``random_state``: a Generator or a
    RandomState as given, else ``np.random.default_rng(random_state)`` (None: fresh entropy)."""
    if isinstance(random_state, (np.random.Generator, np.random.RandomState)):
        return random_state
    if random_state is not None and not isinstance(random_state, (numbers.Integral,
                                                                  np.random.SeedSequence)):
        raise ValueError(f"random_state must be None, an int, a numpy Generator or RandomState, "
                         f"got {random_state!r}")
    return np.random.default_rng(random_state)


def int_seed(random_state):
    """An int seed from an estimator's ``random_state`` (None: 0, so that the result is
    deterministic)."""
    if random_state is None:
        return 0
    if isinstance(random_state, numbers.Integral):
        return int(random_state)
    rng = random_generator(random_state)
    if isinstance(rng, np.random.RandomState):
        return int(rng.randint(0, 2**31 - 1))
    return int(rng.integers(0, 2**63 - 1))


def independent_generators(random_state, k):
    """k generators for k independent tasks (e.g. one per binary problem), whatever runs them in
    which order: one generator for k = 1 (the estimator's own), else k seeded from it."""
    rng = random_generator(random_state)
    if k == 1:
        return [rng]
    if isinstance(rng, np.random.RandomState):
        seeds = rng.randint(0, 2**31 - 1, size=k)
    else:
        seeds = rng.integers(0, 2**63 - 1, size=k)
    return [np.random.default_rng(int(s)) for s in seeds]


# -- the base ----------------------------------------------------------------------------------------
class GPCEstimator(_ClassifierMixin, _Base):
    """The base of gpc's classifiers: input and label checks, the fitted check, ``n_jobs`` and the
    random state, each with one meaning for every estimator.

    Subclasses set ``_fitted_attribute`` (present once fitted) and may set ``_lazy_rows`` (X stays
    the array it is given, NumPy, ``np.memmap`` or Dask, and is checked block by block without being
    copied).
    """

    #: an attribute that ``fit`` sets: its absence means "not fitted"
    _fitted_attribute = "classes_"
    #: keep X as given (row blocks are read later) instead of converting it to one float64 array
    _lazy_rows = False

    def __init_subclass__(cls, **kwargs):
        # every public entry point a class defines runs under the one thread policy
        # (gpc._threads.entry): n_jobs resolved once, BLAS pinned for the call, one call at a time
        super().__init_subclass__(**kwargs)
        for name in ENTRY_POINTS:
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "__wrapped_entry__", False):
                setattr(cls, name, _entry_point(method))

    @_entry_point
    def score(self, X: ArrayLike, y: ArrayLike, sample_weight: Optional[ArrayLike] = None) -> float:
        """Mean accuracy of ``predict(X)`` against ``y`` (scikit-learn's ``ClassifierMixin.score``)."""
        return super().score(X, y, sample_weight=sample_weight)

    # -- inputs ---------------------------------------------------------------------------------
    def _vector_input(self):
        """Whether X holds float vectors (False for kernels on strings, graphs, ...)."""
        return True

    def _check_X(self, X, fitting):
        """X checked, with scikit-learn's messages: dense, numeric, 2-D, non-empty, finite ("X
        contains NaN" / "inf", checked before any work), and with ``n_features_in_`` columns
        after ``fit``; ``feature_names_in_`` set at ``fit`` and checked after it, as in
        scikit-learn."""
        from ._validation import check_feature_names

        check_feature_names(self, X, reset=fitting)
        if not self._vector_input():
            # scikit-learn's validation without forcing a 2-D float array: the kernel reads X
            try:
                from sklearn.utils import check_array
            except ImportError:  # pragma: no cover - such kernels come from scikit-learn
                return np.asarray(X)
            return check_array(X, ensure_2d=False, dtype=None)
        if hasattr(X, "toarray") or hasattr(X, "tocsr"):
            raise TypeError("sparse input is not supported: pass a dense array (X.toarray())")
        if self._lazy_rows and (isinstance(X, np.ndarray) or hasattr(X, "compute")):
            X = self._check_lazy(X)
        else:
            X = check_finite_array(X, "X")
        if X.ndim != 2:
            raise ValueError(f"Expected 2D array, got {X.ndim}D array instead. Reshape your data to "
                             "(n_samples, n_features)")
        if X.shape[0] == 0:
            raise ValueError(f"Found array with 0 sample(s) (shape={X.shape}) while a minimum of 1 "
                             "is required.")
        if X.shape[1] == 0:
            raise ValueError(f"Found array with 0 feature(s) (shape={X.shape}) while a minimum of 1 "
                             "is required.")
        if not fitting and X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                             f"{self.n_features_in_} features as input")
        if self._lazy_rows:
            self._check_finite_rows(X)
        return X

    @staticmethod
    def _check_lazy(X):
        """A NumPy, memmap or Dask X with its dtype checked, not copied."""
        if X.dtype.kind in "biuf":
            return X
        X = np.asarray(X)
        if X.dtype.kind == "c":
            raise ValueError("Complex data not supported: X is complex")
        try:
            return X.astype(np.float64)
        except ValueError as exc:    # a TypeError (a dict in an object array) propagates
            raise ValueError(f"X must be numeric: {exc}") from None

    def _check_finite_rows(self, X):
        """NaN or inf anywhere in a lazily read X, found before any work: one pass over its row
        blocks (a Dask array: one reduction on its workers)."""
        if hasattr(X, "compute"):
            import dask.array as da

            finite = bool(da.isfinite(X).all().compute())
        else:
            finite = all(np.isfinite(X[a:a + BLOCK_ROWS]).all()
                         for a in range(0, X.shape[0], BLOCK_ROWS))
        if not finite:
            if hasattr(X, "compute"):
                has_nan = bool(da.isnan(X).any().compute())
            else:
                has_nan = any(np.isnan(X[a:a + BLOCK_ROWS]).any()
                              for a in range(0, X.shape[0], BLOCK_ROWS))
            raise ValueError(f"X contains {'NaN' if has_nan else 'inf'}")

    def _check_y(self, y, n):
        """Class labels: 1-D (a column vector is raveled with scikit-learn's warning), n of them,
        no NaN, not continuous."""
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None")
        y = np.asarray(y)
        if y.ndim == 2 and y.shape[1] == 1:
            warnings.warn("A column-vector y was passed when a 1d array was expected. Please change the "
                          "shape of y to (n_samples, ), for example using ravel().",
                          DataConversionWarning, stacklevel=3)
            y = y.ravel()
        if y.ndim != 1:
            raise ValueError(f"y should be a 1d array, got an array of shape {y.shape} instead")
        if y.shape[0] != n:
            raise ValueError(f"X has {n} samples but y has {y.shape[0]}")
        if y.dtype.kind == "f":
            if not np.all(np.isfinite(y)):
                raise ValueError("y contains NaN or inf")
            if np.any(y != np.round(y)):
                raise ValueError("Unknown label type: continuous. gpc classifies; y must hold class labels")
        if y.dtype.kind == "O" and any(isinstance(v, float) and np.isnan(v) for v in y):
            raise ValueError("y contains NaN")
        return y

    def _check_fitted(self):
        if not hasattr(self, self._fitted_attribute):
            raise NotFittedError(f"This {type(self).__name__} instance is not fitted yet. Call 'fit' "
                                 "with appropriate arguments before using this estimator.")

    # -- parallelism and randomness ---------------------------------------------------------------
    def _n_jobs(self):
        """The workers ``n_jobs`` asks for (:func:`resolve_n_jobs`)."""
        return resolve_n_jobs(self.n_jobs)

    def _rng(self):
        """The generator of ``random_state`` (:func:`random_generator`)."""
        return random_generator(self.random_state)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        return tags
