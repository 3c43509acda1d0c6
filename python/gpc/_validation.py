"""Input checks shared by every entry point: fail early, with a message that names the problem."""

import numbers
import warnings

import numpy as np


def plain(value):
    """``value`` as a plain Python object for a message: a NumPy scalar (a class label, a count)
    becomes its Python scalar, so that ``f"{plain(v)!r}"`` prints ``0`` or ``'a'``, never
    ``np.int64(0)`` or ``np.str_('a')``; arrays become lists; anything else is returned as is."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    return value


def check_finite_array(a, name, ndim=None, dtype=np.float64) -> np.ndarray:
    """Return ``a`` as a contiguous float array, raising ValueError for NaN, inf or a wrong rank."""
    if hasattr(a, "toarray") or hasattr(a, "tocsr"):
        raise TypeError(f"{name} is a sparse matrix; gpc needs dense input (use {name}.toarray())")
    raw = a if isinstance(a, np.ndarray) else np.asarray(a)
    if raw.dtype.kind == "c":
        raise ValueError(f"Complex data not supported: {name} is complex")
    try:
        arr = np.ascontiguousarray(raw, dtype=dtype)
    except ValueError as exc:   # TypeError (e.g. a dict in an object array) propagates as is
        raise ValueError(f"{name} must be numeric: {exc}") from None
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-dimensional, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        bad = "NaN" if np.isnan(arr).any() else "inf"
        raise ValueError(f"{name} contains {bad}")
    return arr


def check_kernel_matrix(K):
    """Check a prior covariance: square, symmetric to rounding, finite."""
    K = check_finite_array(K, "K", ndim=2)
    n = K.shape[0]
    if K.shape != (n, n):
        raise ValueError(f"K must be square, got shape {K.shape}")
    if n == 0:
        raise ValueError("K is empty: at least one data point is needed")
    scale = max(float(np.max(np.abs(np.diag(K)))), np.finfo(float).tiny)
    # by blocks of rows, so that the check's temporaries are block x n, not two n x n
    block = 256
    for i in range(0, n, block):
        rows = slice(i, min(i + block, n))
        if np.max(np.abs(K[rows] - K[:, rows].T)) > 1e-8 * scale:
            raise ValueError("K is not symmetric")
    return K


def check_signed_labels(y, n):
    """Labels for the inference layer: a length-n array of -1 and +1."""
    y = check_finite_array(y, "y", ndim=1)
    if y.shape[0] != n:
        raise ValueError(f"y has {y.shape[0]} labels but K is {n}x{n}")
    if not np.all((y == 1.0) | (y == -1.0)):
        raise ValueError("y must hold labels -1 and +1 only; the estimator maps class labels for you")
    if n > 1 and np.all(y == y[0]):
        warnings.warn(f"y holds only {y[0]:+.0f} labels, one class: the posterior and evidence are of a "
                      "one-class problem. If the classes are strings, map them with np.where(y == "
                      "positive_class, 1.0, -1.0) (a comparison of strings with a number is False for "
                      "every row)", UserWarning, stacklevel=3)
    return y


def check_prior_mean(prior_mean, n):
    if prior_mean is None:
        return np.zeros(n)
    m = np.asarray(prior_mean, dtype=np.float64)
    if m.ndim == 0:
        m = np.full(n, float(m))
    m = check_finite_array(m, "prior_mean", ndim=1)
    if m.shape[0] != n:
        raise ValueError(f"prior_mean has length {m.shape[0]}, expected {n}")
    return m


def check_positive_int(value, name, minimum=1):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_positive_float(value, name, allow_zero=False):
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and np.isfinite(value)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def check_optimizer(optimizer):
    """An estimator's ``optimizer``: None, "fmin_l_bfgs_b" or a callable (scikit-learn's choices),
    checked at ``fit`` even when there is nothing to optimise."""
    if not (optimizer is None or callable(optimizer)
            or (isinstance(optimizer, str) and optimizer == "fmin_l_bfgs_b")):
        raise ValueError(f"optimizer must be 'fmin_l_bfgs_b', a callable or None, got {optimizer!r}")
    return optimizer
