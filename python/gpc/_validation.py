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


def _feature_names(X):
    """The string column names of a DataFrame-like X as an object array, None without them;
    scikit-learn's ``_get_feature_names`` (names of mixed types are a TypeError)."""
    columns = getattr(X, "columns", None)
    if columns is None:
        return None
    names = np.asarray(columns, dtype=object)
    kinds = sorted({type(name).__name__ for name in names})
    is_str = [isinstance(name, str) for name in names]
    if len(kinds) > 1 and any(is_str):
        raise TypeError("Feature names are only supported if all input features have string names, "
                        f"but your input has {kinds} as feature name / column name types. If you "
                        "want feature names to be stored and validated, you must convert them all "
                        "to strings, by using X.columns = X.columns.astype(str) for example. "
                        "Otherwise you can remove feature / column names from your input data, or "
                        "convert them all to a non-string data type.")
    return names if len(names) and all(is_str) else None


def _local_check_feature_names(estimator, X, *, reset):
    """scikit-learn's ``_check_feature_names`` (1.9), for an install without scikit-learn."""
    if reset:
        names = _feature_names(X)
        if names is not None:
            estimator.feature_names_in_ = names
        elif hasattr(estimator, "feature_names_in_"):
            del estimator.feature_names_in_
        return
    fitted, given = getattr(estimator, "feature_names_in_", None), _feature_names(X)
    name = type(estimator).__name__
    if fitted is None and given is None:
        return
    if fitted is None:
        warnings.warn(f"X has feature names, but {name} was fitted without feature names")
        return
    if given is None:
        warnings.warn(f"X does not have valid feature names, but {name} was fitted with feature "
                      "names")
        return
    if len(fitted) == len(given) and np.all(fitted == given):
        return
    unexpected, missing = sorted(set(given) - set(fitted)), sorted(set(fitted) - set(given))

    def listed(names):
        lines = [f"- {n}\n" for n in names[:5]]
        return "".join(lines) + ("- ...\n" if len(names) > 5 else "")

    message = "The feature names should match those that were passed during fit.\n"
    if unexpected:
        message += "Feature names unseen at fit time:\n" + listed(unexpected)
    if missing:
        message += "Feature names seen at fit time, yet now missing:\n" + listed(missing)
    if not unexpected and not missing:
        message += "Feature names must be in the same order as they were in fit.\n"
    raise ValueError(message)


def check_feature_names(estimator, X, reset):
    """Set (``reset``: at ``fit``) or check ``estimator.feature_names_in_`` from X's string column
    names, as scikit-learn does: scikit-learn's own ``_check_feature_names`` when it is installed,
    else the same rule here.  At prediction, other names (or another order) raise ValueError, and
    names on one side only warn."""
    try:
        from sklearn.utils.validation import _check_feature_names
    except ImportError:   # scikit-learn < 1.6 has it as a method of BaseEstimator, or is absent
        method = getattr(estimator, "_check_feature_names", None)
        if method is not None:
            return method(X, reset=reset)
        _check_feature_names = _local_check_feature_names
    return _check_feature_names(estimator, X, reset=reset)


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


def check_kernel_matrix(K) -> np.ndarray:
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
