"""Covariance functions for gpc.

Every kernel keeps its positive hyperparameters as plain attributes (the constructor arguments)
and exposes them to optimisers as ``theta``: the natural logarithm of the free (not fixed)
hyperparameters, concatenated in a flat array, with log-space ``bounds`` of shape (p, 2).  The
interface follows scikit-learn's kernel API (``theta``, ``bounds``, ``__call__``, ``diag``,
``clone_with_theta``, ``get_params``/``set_params``, ``+`` and ``*``) so that a gpc kernel can stand
in for a scikit-learn kernel and ``sklearn.base.clone`` rebuilds it.

What gpc's own inference code uses instead of the (n, n, p) gradient tensor is the contraction

    gradient_contract(X, M)[k] = sum_ij M_ij dK_ij / d theta_k        (theta = log hyperparameters)

which each kernel computes in O(n^2) memory without forming the tensor, and

    gradient_inputs(X, Y, M)[i, d] = sum_j M_ij d k(x_i, y_j) / d x_id

(the derivative with respect to the *first* argument only) for optimising inducing inputs.  The
derivative of sum_ij M_ij k(z_i, z_j) with respect to Z is therefore
``gradient_inputs(Z, Z, M) + gradient_inputs(Z, Z, M.T)``.

Stationary kernels write k = f(r) with the scaled distance r^2 = sum_d (x_d - y_d)^2 / l_d^2 and
share one identity: with W(r) = -f'(r) / r,

    d k / d log l_d = W(r) (x_d - y_d)^2 / l_d^2,      d k / d x_d = -W(r) (x_d - y_d) / l_d^2,

so a single n x n weight matrix W serves every length scale (isotropic: d k / d log l = W r^2).
"""

import inspect
import numbers
import warnings

import numpy as np
from scipy.linalg.blas import dgemm as _dgemm, dsyrk as _dsyrk

from . import _kernels, _lapack
from ._parallel import over_rows
from ._validation import check_finite_array
from .exceptions import ConvergenceWarning

__all__ = [
    "Kernel", "RBF", "Matern", "Polynomial", "Linear", "ConstantKernel", "WhiteKernel",
    "Sum", "Product", "as_kernel", "user_kernel",
]


# ----------------------------------------------------------------------------------------------
# helpers


def _check_X(X, name="X"):
    return check_finite_array(X, name, ndim=2)


def _check_XY(X, Y):
    """Validate X and Y; return (X, Y) with Y None meaning 'Y is X'."""
    if Y is X:
        Y = None
    X = _check_X(X)
    if Y is not None:
        Y = _check_X(Y, "Y")
        if Y.shape[1] != X.shape[1]:
            raise ValueError(f"X has {X.shape[1]} features but Y has {Y.shape[1]}")
    return X, Y


def _check_M(M, shape, name="M"):
    """Shape and dtype only: finiteness is checked on the (length-p) result, which NaN/inf in M
    (or in a K handed to a contraction) reaches, so the hot path skips an O(n^2) pass over M."""
    try:
        M = np.ascontiguousarray(M, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric: {exc}") from None
    if M.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {M.shape}")
    return M


def _check_result(out, M, K=None):
    if not np.all(np.isfinite(out)):
        check_finite_array(M, "M")  # names NaN / inf in M (or K) when that is the cause
        if K is not None:
            check_finite_array(K, "K")
        raise ValueError("the gradient is not finite: hyperparameters out of floating-point range?")
    return out


_BLOCK = 256


def _mirror_lower(A):
    """Copy the lower triangle of square A onto its upper triangle, in place, block by block."""
    n = A.shape[0]
    for i0 in range(0, n, _BLOCK):
        i1 = min(i0 + _BLOCK, n)
        D = A[i0:i1, i0:i1]
        iu = np.triu_indices(i1 - i0, 1)
        D[iu] = D.T[iu]
        if i1 < n:
            A[i0:i1, i1:] = A[i1:, i0:i1].T
    return A


def _sqdist(U, V=None):
    """Squared Euclidean distances between rows, by |u|^2 + |v|^2 - 2 u.v, clipped at 0.

    With V None the Gram part comes from dsyrk (half the flops of gemm) and the result is exactly
    symmetric with an exactly zero diagonal.  Callers centre the inputs first so the cancellation
    error stays at the scale of the data's spread.
    """
    su = np.einsum("ij,ij->i", U, U)
    if V is None:
        # dsyrk on the Fortran-ordered U fills the upper triangle of a Fortran array; its transpose
        # is a C-ordered array holding the lower triangle.
        R2 = _dsyrk(-2.0, np.asfortranarray(U)).T
        with np.errstate(invalid="ignore"):     # inputs beyond 1e154: inf − inf on the diagonal,
            R2 += su[:, None]                   # which is set to its exact 0 below
            R2 += su[None, :]
        _mirror_lower(R2)  # after the additions, which are not symmetric in rounding
        np.fill_diagonal(R2, 0.0)
    else:
        sv = np.einsum("ij,ij->i", V, V)
        R2 = U @ V.T
        R2 *= -2.0
        R2 += su[:, None]
        R2 += sv[None, :]
    np.maximum(R2, 0.0, out=R2)
    return R2


def _gram_lower(U):
    """(G, su): G C-ordered with U U^T in its lower triangle (dsyrk), su_i = |u_i|^2."""
    U = np.ascontiguousarray(U, dtype=np.float64)
    su = np.einsum("ij,ij->i", U, U)
    G = np.empty((U.shape[0], U.shape[0]))
    _lapack.row_gram_lower(U, G)          # into uninitialised memory: no zero fill of n x n
    return G, su


#: up to this many input dimensions, stationary kernels form distances directly (gpc._kernels
#: gram_direct / contract_direct); above, from a BLAS Gram matrix
DIRECT_MAX_D = 8


#: rows per block of the vectorised exponential in _gram
_EXP_ROWS = 64
#: gpc._kernels' code of the squared exponential (RBF._kind)
_KIND_RBF = 0


def _gram(U, V, kind, scale=1.0):
    """K = scale * f(r^2) between the rows of U and V (V None: U itself) for a stationary ``kind``.

    K(U, U): the strict lower triangle first holds r^2, or for the squared exponential its
    exponent -r^2/2, from direct differences (few dimensions) or a BLAS Gram matrix;
    NumPy's vectorised exp then makes the values (ten times as fast as the C library's scalar exp,
    which was most of the kernel matrix's time) by row blocks of the lower triangle, and one pass
    sets the diagonal and mirrors.  The Matérn kinds, whose polynomial factor needs care at
    r = inf, take the scalar pass of gpc._kernels.
    """
    if V is not None:
        # U V^T through scipy's BLAS (the BLAS of the solves that follow a cross-covariance)
        G = _dgemm(1.0, V, U, trans_b=True).T
        su, sv = np.einsum("ij,ij->i", U, U), np.einsum("ij,ij->i", V, V)
        if kind != _KIND_RBF:
            over_rows(_kernels.cross_to_kernel, G.shape[0], G, su, sv, kind, scale, cost="rows")
            return G
        over_rows(_cross_exp, G.shape[0], G, su, sv, scale, cost="rows")
        return G
    n = U.shape[0]
    rbf = kind == _KIND_RBF
    factor = -0.5 if rbf else 1.0
    if U.shape[1] <= DIRECT_MAX_D:
        K = np.empty((n, n))
        over_rows(_kernels.sqdist_direct, n, np.ascontiguousarray(U.T), K, 0.0, factor)
    else:
        K, su = _gram_lower(U)
        over_rows(_kernels.gram_to_sqdist, n, K, su, 0.0, factor)
    if not rbf:
        over_rows(_kernels.sqdist_to_kernel, n, K, kind, scale)
        return K
    over_rows(_exp_and_finish, n, K, scale)
    return K


def _exp_and_finish(K, scale, *, start, stop):
    """Rows start..stop-1 of a squared exponential's K from its exponents (strict lower triangle):
    NumPy's exp by row blocks (it releases the GIL), then the diagonal, c * exp(...) (the rounding
    of c * K, not of exp(log c - ...)) and the mirror in one pass (gpc._kernels.finish_kernel)."""
    # a block's columns run to its last row: the upper corner of its diagonal square is scratch
    # (overwritten by the mirror of these rows), whatever it holds
    with np.errstate(over="ignore", invalid="ignore"):
        for i0 in range(start, stop, _EXP_ROWS):
            i1 = min(i0 + _EXP_ROWS, stop)
            block = K[i0:i1, :i1]
            np.exp(block, out=block)
    _kernels.finish_kernel(K, scale, scale != 1.0, start=start, stop=stop)


def _cross_exp(G, su, sv, scale, *, start, stop):
    """Rows start..stop-1 of a squared exponential's cross-covariance from G = U Vᵀ."""
    _kernels.cross_sqdist(G, su, sv, -0.5, start=start, stop=stop)
    block = G[start:stop]
    np.exp(block, out=block)
    if scale != 1.0:
        block *= scale


def _sum_parts(parts):
    """The sums of a pass's row ranges, added in range order (the same bits for any number of
    threads): a tuple of totals, one per returned item."""
    totals = list(parts[0])
    for part in parts[1:]:
        for k, item in enumerate(part):
            totals[k] = totals[k] + item
    return tuple(totals)


def _check_positive_values(value, name):
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number or array of them, got {value!r}") from None
    if arr.ndim > 1 or arr.size == 0:
        raise ValueError(f"{name} must be a scalar or a non-empty 1-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if not np.all(arr > 0):
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return np.atleast_1d(arr)


def _check_bounds(bounds, name, n):
    """Return log-bounds of shape (n, 2), or None when fixed."""
    if isinstance(bounds, str):
        if bounds == "fixed":
            return None
        raise ValueError(f"{name} must be a (low, high) pair or 'fixed', got {bounds!r}")
    try:
        b = np.asarray(bounds, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) pair or 'fixed', got {bounds!r}") from None
    if b.shape == (2,):
        b = np.tile(b, (n, 1))
    if b.shape != (n, 2):
        raise ValueError(f"{name} must have shape (2,) or ({n}, 2), got {b.shape}")
    if not np.all(np.isfinite(b)):
        raise ValueError(f"{name} must be finite, got {bounds!r}")
    if not np.all(b > 0):
        raise ValueError(f"{name} must be > 0 (they are bounds of a positive quantity), got {bounds!r}")
    if not np.all(b[:, 0] <= b[:, 1]):
        raise ValueError(f"{name} must have low <= high, got {bounds!r}")
    return np.log(b)


def _params_equal(a, b):
    if isinstance(a, Kernel) or isinstance(b, Kernel):
        return a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if a is None or b is None:
        return a is b
    try:
        return np.array_equal(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    except (TypeError, ValueError):
        return a == b


# ----------------------------------------------------------------------------------------------
# base class


class Kernel:
    """Base class of gpc covariance functions.

    Leaf kernels list their positive hyperparameters in the class attribute ``_hyper``; each name
    ``h`` is a constructor argument stored as attribute ``h`` with bounds in attribute ``h_bounds``
    (a (low, high) pair, an (n, 2) array, or ``"fixed"``).  Fixed hyperparameters are not part of
    ``theta``.

    Subclasses implement ``_call(X, Y, eval_gradient)``, ``diag``,
    ``_contract(X, M, K=None, symmetric=False)`` and ``_grad_inputs(X, Y, M)`` on validated inputs
    (Y None means Y = X).  ``_contract`` may be handed the kernel's own K(X, X) when the caller
    already computed it, and the promise that M is symmetric (see :meth:`gradient_contract`).
    """

    _hyper: tuple[str, ...] = ()
    requires_vector_input = True

    def _constant(self):
        """c when the kernel is the constant c (a product then scales instead of multiplying)."""
        return None

    def _call_times(self, X, Y, c):
        """c K(X, Y) for a constant factor c of a product (X, Y checked by the product)."""
        K = self(X, Y)
        K *= c
        return K

    def _diagonal(self):
        """Whether K(X, X) is diagonal (white noise): in a sum, the other term's K(X, X) then equals
        the sum's off the diagonal, which is all a contraction reads of a K handed to it."""
        return False

    # -- parameters (constructor arguments) -----------------------------------------------------

    @classmethod
    def _param_names(cls):
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def get_params(self, deep=True):
        """Constructor arguments as a dict; with ``deep`` also ``k1__name`` entries of sub-kernels."""
        params = {}
        for name in self._param_names():
            value = getattr(self, name)
            params[name] = value
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                for sub, subval in value.get_params(deep=True).items():
                    params[f"{name}__{sub}"] = subval
        return params

    def set_params(self, **params):
        """Set constructor arguments (``k1__length_scale=...`` reaches into sub-kernels)."""
        if not params:
            return self
        valid = self._param_names()
        nested = {}
        for key, value in params.items():
            head, sep, sub = key.partition("__")
            if head not in valid:
                raise ValueError(f"invalid parameter {head!r} for kernel {type(self).__name__}; "
                                 f"valid parameters are {valid}")
            if sep:
                nested.setdefault(head, {})[sub] = value
            else:
                setattr(self, head, value)
        for head, sub in nested.items():
            getattr(self, head).set_params(**sub)
        self._validate()
        return self

    def _validate(self):
        """Check hyperparameters and bounds; raise ValueError naming the problem."""
        for h in self._hyper:
            vals = _check_positive_values(getattr(self, h), h)
            _check_bounds(getattr(self, h + "_bounds"), h + "_bounds", vals.size)

    def clone_with_theta(self, theta):
        """A copy of this kernel (rebuilt from its parameters) with ``theta`` set."""
        new = self._clone()
        new.theta = theta
        return new

    def _clone(self):
        params = {}
        for name, value in self.get_params(deep=False).items():
            if isinstance(value, Kernel):
                value = value._clone()
            elif isinstance(value, np.ndarray):
                value = value.copy()
            params[name] = value
        return type(self)(**params)

    # -- hyperparameters in log space ----------------------------------------------------------

    def _hyper_entries(self):
        """List of (name, values 1-D, log-bounds (n,2) or None) for each leaf hyperparameter."""
        out = []
        for h in self._hyper:
            vals = _check_positive_values(getattr(self, h), h)
            out.append((h, vals, _check_bounds(getattr(self, h + "_bounds"), h + "_bounds", vals.size)))
        return out

    @property
    def theta(self):
        """Natural log of the free hyperparameters, flattened (length ``n_dims``)."""
        parts = [np.log(v) for _, v, b in self._hyper_entries() if b is not None]
        return np.concatenate(parts) if parts else np.empty(0)

    @theta.setter
    def theta(self, theta):
        theta = self._check_theta(theta)
        i = 0
        for h, vals, b in self._hyper_entries():
            if b is None:
                continue
            new = np.exp(theta[i:i + vals.size])
            i += vals.size
            if np.ndim(getattr(self, h)) == 0:
                setattr(self, h, float(new[0]))
            else:
                setattr(self, h, new)

    def _check_theta(self, theta):
        try:
            theta = np.asarray(theta, dtype=np.float64).ravel()
        except (TypeError, ValueError):
            raise ValueError(f"theta must be numeric, got {theta!r}") from None
        if theta.size != self.n_dims:
            raise ValueError(f"theta has {theta.size} entries but {type(self).__name__} has "
                             f"{self.n_dims} free hyperparameters {self.hyperparameter_names}")
        if not np.all(np.isfinite(theta)):
            raise ValueError(f"theta must be finite, got {theta}")
        with np.errstate(over="ignore", under="ignore"):
            values = np.exp(theta)
        if np.any(values == 0) or not np.all(np.isfinite(values)):
            raise ValueError(f"theta = {theta} gives hyperparameters that are 0 or inf in float64")
        return theta

    @property
    def bounds(self):
        """Log-space bounds of ``theta``, shape (n_dims, 2)."""
        parts = [b for _, _, b in self._hyper_entries() if b is not None]
        return np.vstack(parts) if parts else np.empty((0, 2))

    @property
    def n_dims(self):
        """Number of free hyperparameters (length of ``theta``)."""
        return self.theta.shape[0]

    @property
    def hyperparameter_names(self):
        """One name per entry of ``theta``: ``name`` or ``name[i]`` for arrays, ``k1__`` prefixes."""
        names = []
        for h, vals, b in self._hyper_entries():
            if b is None:
                continue
            if np.ndim(getattr(self, h)) == 0:
                names.append(h)
            else:
                names.extend(f"{h}[{i}]" for i in range(vals.size))
        return names

    def _check_bounds_params(self):
        """Warn when a hyperparameter sits at its bound (scikit-learn's estimators call this)."""
        theta, bounds = self.theta, self.bounds
        for name, t, (lo, hi) in zip(self.hyperparameter_names, theta, bounds):
            if np.isclose(t, lo):
                warnings.warn(f"the optimal value of {name} is close to its lower bound "
                              f"{np.exp(lo):.3g}; consider lowering the bound", ConvergenceWarning)
            elif np.isclose(t, hi):
                warnings.warn(f"the optimal value of {name} is close to its upper bound "
                              f"{np.exp(hi):.3g}; consider raising the bound", ConvergenceWarning)

    # -- evaluation --------------------------------------------------------------------------

    def __call__(self, X, Y=None, eval_gradient=False):
        """Kernel matrix K(X, Y), and with ``eval_gradient`` its gradient tensor.

        Parameters
        ----------
        X : array of shape (n, d)
        Y : array of shape (m, d), optional
            None (or ``X`` itself) means K(X, X).
        eval_gradient : bool
            Also return dK of shape (n, n, n_dims), the derivative with respect to ``theta``
            (log space).  Only when Y is None.  Kept for scikit-learn compatibility; prefer
            :meth:`gradient_contract`.

        Returns
        -------
        K : array of shape (n, m)
        K_gradient : array of shape (n, n, n_dims), if ``eval_gradient``
        """
        X, Y = _check_XY(X, Y)
        if eval_gradient and Y is not None:
            raise ValueError("the gradient can only be evaluated when Y is None")
        return self._call(X, Y, eval_gradient)

    def diag(self, X):
        """The diagonal of K(X, X), shape (n,), without forming K."""
        X = _check_X(X)
        return self._diag(X)

    def gradient_contract(self, X, M, K=None, symmetric=False):
        """g_k = sum_ij M_ij dK_ij/dtheta_k (theta in log space) without forming the tensor.

        Parameters
        ----------
        X : array of shape (n, d)
        M : array of shape (n, n)
            Any square matrix (need not be symmetric).
        K : array of shape (n, n), optional
            This kernel's matrix K(X) when the caller already holds it (an evidence gradient does).
            Stationary kernels and their products with a constant then read their values from it
            instead of recomputing them (for the squared exponential that is all its
            exponentials).  Only the strict lower triangle is read, so jitter on the diagonal does
            not matter; a K from other hyperparameters gives a wrong gradient.
        symmetric : bool, default False
            A promise that M is symmetric, as the matrix of an evidence gradient is.  Stationary
            kernels then read only its lower triangle (half the memory traffic); for a non-symmetric
            M the result is that of its lower triangle mirrored, i.e. wrong.

        Returns
        -------
        g : array of shape (n_dims,)
        """
        X = _check_X(X)
        n = X.shape[0]
        M = _check_M(M, (n, n))
        if K is not None:
            K = _check_M(K, (n, n), name="K")
        return _check_result(self._contract(X, M, K=K, symmetric=bool(symmetric)), M, K)

    def gradient_inputs(self, X, Y, M):
        """G[i, d] = sum_j M_ij d k(x_i, y_j) / d x_id (derivative in the first argument only).

        Parameters
        ----------
        X : array of shape (n, d)
        Y : array of shape (m, d) or None (meaning X)
        M : array of shape (n, m)

        Returns
        -------
        G : array of shape (n, d)
        """
        X, Y = _check_XY(X, Y)
        m = X.shape[0] if Y is None else Y.shape[0]
        M = _check_M(M, (X.shape[0], m))
        return _check_result(self._grad_inputs(X, X if Y is None else Y, M), M)

    def _grad_inputs(self, X, Y, M):
        raise NotImplementedError(f"gradient_inputs is not implemented for {type(self).__name__}")

    def _contract_value(self, X, M, K=None, scale=1.0, symmetric=False):
        """(gradient_contract(X, M), sum_ij M_ij k_ij); stationary kernels do both in one pass and
        may take k from K = scale * k(X) when given.  Here k(X) is recomputed and K not read."""
        own = self._call(X, None, False)
        return self._contract(X, M, K=own, symmetric=symmetric), float(np.vdot(M, own))

    def is_stationary(self):
        """Whether k(x, y) depends on x - y only."""
        return True

    # -- algebra, comparison, display --------------------------------------------------------

    def __add__(self, other):
        return Sum(self, other if _is_kernel_like(other) else ConstantKernel(other))

    def __radd__(self, other):
        return Sum(other if _is_kernel_like(other) else ConstantKernel(other), self)

    def __mul__(self, other):
        return Product(self, other if _is_kernel_like(other) else ConstantKernel(other))

    def __rmul__(self, other):
        return Product(other if _is_kernel_like(other) else ConstantKernel(other), self)

    def __eq__(self, other):
        if type(self) is not type(other):
            return NotImplemented
        a, b = self.get_params(deep=False), other.get_params(deep=False)
        return a.keys() == b.keys() and all(_params_equal(a[k], b[k]) for k in a)

    __hash__ = None  # type: ignore[assignment]  # equal kernels compare by parameters: unhashable

    def __repr__(self):
        args = ", ".join(f"{k}={_fmt(v)}" for k, v in self.get_params(deep=False).items())
        return f"{type(self).__name__}({args})"


def _fmt(v):
    if isinstance(v, np.ndarray):
        return "[" + ", ".join(f"{x:.3g}" for x in v.ravel()) + "]"
    if isinstance(v, float):
        return f"{v:.3g}"
    return repr(v)


def _is_kernel_like(obj):
    return isinstance(obj, Kernel) or all(
        hasattr(obj, a) for a in ("theta", "bounds", "diag", "clone_with_theta"))


# ----------------------------------------------------------------------------------------------
# stationary kernels


class _Stationary(Kernel):
    """k = f(r), r^2 = sum_d (x_d - y_d)^2 / l_d^2.  Subclasses give f and W = -f'(r)/r of R2.

    The kernel matrix and the gradient contraction run in gpc._kernels (one pass over the lower
    triangle after a BLAS Gram matrix); the NumPy ``_f``/``_w`` serve the gradient tensor and the
    input gradient.
    """

    _hyper = ("length_scale",)

    def _kind(self):
        raise NotImplementedError

    def _length_scales(self, n_features):
        ls = _check_positive_values(self.length_scale, "length_scale")
        if ls.size != 1 and ls.size != n_features:
            raise ValueError(f"length_scale has {ls.size} entries (ARD) but X has "
                             f"{n_features} features")
        return ls

    def _scaled(self, X, Y):
        ls = self._length_scales(X.shape[1])
        shift = X.mean(axis=0)  # translation invariance: centring keeps |u|^2 small
        U = (X - shift) / ls
        V = None if Y is None else (Y - shift) / ls
        return ls, U, V

    def _f(self, R2):
        raise NotImplementedError

    def _w(self, R2, K):
        raise NotImplementedError

    def _free(self):
        return self._hyper_entries()[0][2] is not None

    def _call_times(self, X, Y, c):
        # c * K in the pass that makes K (a constant factor of a product)
        _, U, V = self._scaled(X, Y)
        return _gram(U, V, self._kind(), c)

    def _call(self, X, Y, eval_gradient):
        ls, U, V = self._scaled(X, Y)
        if not eval_gradient:
            return _gram(U, V, self._kind())
        R2 = _sqdist(U, V)
        K = self._f(R2)
        if not self._free():
            return K, np.empty(K.shape + (0,))
        W = self._w(R2, K)
        if ls.size == 1:
            return K, _times_weight(W, R2)[:, :, None]
        D2 = (U[:, None, :] - U[None, :, :]) ** 2
        return K, _times_weight(W[:, :, None], D2)

    def _diag(self, X):
        self._length_scales(X.shape[1])
        return np.ones(X.shape[0])

    def _contract(self, X, M, K=None, symmetric=False):
        return self._contract_value(X, M, K, symmetric=symmetric)[0] if self._free() else np.empty(0)

    def _contract_value(self, X, M, K=None, scale=1.0, symmetric=False):
        """(sum_ij M_ij dK_ij/dlog l, sum_ij M_ij K_ij) in one pass (gpc._kernels.contract).

        Given K = scale * k(X) (strict lower triangle read), the values come from it: no
        exponentials, which are most of the pass's cost."""
        ls, U, _ = self._scaled(X, None)
        ard = ls.size > 1 and self._free()
        n = U.shape[0]
        if U.shape[1] <= DIRECT_MAX_D:
            parts = over_rows(_kernels.contract_direct, n, np.ascontiguousarray(U.T), M, self._kind(),
                              ard, K, scale, symmetric)
            value, iso, g = _sum_parts(parts)
            if not self._free():
                return np.empty(0), value
            return (g if ard else np.array([iso])), value
        G, su = _gram_lower(U)
        value, iso = _sum_parts(over_rows(_kernels.contract, n, G, su, M, self._kind(), ard, K, scale,
                                          symmetric))
        if not self._free():
            return np.empty(0), value
        if not ard:
            return np.array([iso]), value
        # G is now S, S_ij = (M_ij + M_ji) W_ij / 2 (zero diagonal):
        # sum_ij M_ij W_ij (u_id - u_jd)^2 = 2 [sum_i u_id^2 (S 1)_i - sum_i u_id (S U)_id]
        # S U through scipy's BLAS (S is symmetric: its C-ordered buffer is itself in Fortran order),
        # not NumPy's, whose idle threads would spin against the next factorisation's
        SU = _dgemm(1.0, G.T, np.asfortranarray(U))
        g = 2.0 * (G.sum(axis=1) @ (U * U) - np.einsum("id,id->d", U, SU))
        return g, value

    def _grad_inputs(self, X, Y, M):
        ls, U, V = self._scaled(X, Y)
        A = self._w(_sqdist(U, V), None)
        A *= M
        # G_id = -sum_j A_ij (u_id - v_jd) / l_d
        return -(U * A.sum(axis=1)[:, None] - A @ V) / ls


class RBF(_Stationary):
    r"""Squared-exponential (radial basis function) kernel.

    .. math:: k(x, y) = \exp\left(-\tfrac12 \sum_d (x_d - y_d)^2 / \ell_d^2\right)

    Parameters
    ----------
    length_scale : float or array of shape (n_features,), default 1.0
        A scalar gives the isotropic kernel; an array one length scale per feature (ARD).
    length_scale_bounds : pair of floats, array of shape (n, 2), or "fixed", default (1e-5, 1e5)

    Notes
    -----
    :math:`\partial k / \partial \log \ell_d = k \, (x_d - y_d)^2 / \ell_d^2`.
    """

    def __init__(self, length_scale=1.0, length_scale_bounds=(1e-5, 1e5)):
        self.length_scale = length_scale
        self.length_scale_bounds = length_scale_bounds
        self._validate()

    def _f(self, R2):
        K = np.multiply(R2, -0.5)
        np.exp(K, out=K)
        return K

    def _w(self, R2, K):
        return self._f(R2) if K is None else K.copy()

    def _kind(self):
        return _KIND_RBF


class Matern(_Stationary):
    r"""Matérn kernel with half-integer smoothness.

    With the scaled distance :math:`r = \sqrt{\sum_d (x_d - y_d)^2 / \ell_d^2}`:

    - :math:`\nu = 1/2`: :math:`k = e^{-r}`
    - :math:`\nu = 3/2`: :math:`k = (1 + \sqrt3 r) e^{-\sqrt3 r}`
    - :math:`\nu = 5/2`: :math:`k = (1 + \sqrt5 r + 5 r^2 / 3) e^{-\sqrt5 r}`

    Parameters
    ----------
    length_scale : float or array of shape (n_features,), default 1.0
    length_scale_bounds : pair of floats, array of shape (n, 2), or "fixed", default (1e-5, 1e5)
    nu : {0.5, 1.5, 2.5}, default 1.5
        Fixed, not a hyperparameter.

    Notes
    -----
    :math:`\partial k / \partial \log \ell_d = W(r) (x_d - y_d)^2 / \ell_d^2` with
    :math:`W = -k'(r)/r`: :math:`e^{-r}/r` (0 at r = 0), :math:`3 e^{-\sqrt3 r}`,
    :math:`\tfrac53 (1 + \sqrt5 r) e^{-\sqrt5 r}` respectively.  For ν = 1/2 the derivative in
    the inputs at x = y does not exist; ``gradient_inputs`` uses 0 there.
    """

    def __init__(self, length_scale=1.0, length_scale_bounds=(1e-5, 1e5), nu=1.5):
        self.length_scale = length_scale
        self.length_scale_bounds = length_scale_bounds
        self.nu = nu
        self._validate()

    def _validate(self):
        super()._validate()
        if self.nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"nu must be 0.5, 1.5 or 2.5, got {self.nu!r}")

    def _f(self, R2):
        r = np.sqrt(R2)
        if self.nu == 0.5:
            return np.exp(-r)
        if self.nu == 1.5:
            r *= np.sqrt(3.0)
            return _poly_times_exp(1.0 + r, r)
        r *= np.sqrt(5.0)
        return _poly_times_exp(1.0 + r + r * r / 3.0, r)

    def _kind(self):
        return {0.5: 1, 1.5: 2, 2.5: 3}[float(self.nu)]

    def _w(self, R2, K):
        r = np.sqrt(R2)
        if self.nu == 0.5:
            with np.errstate(divide="ignore", invalid="ignore"):
                W = np.exp(-r) / r
            W[r == 0] = 0.0
            return W
        if self.nu == 1.5:
            W = np.exp(-np.sqrt(3.0) * r)
            W *= 3.0
            return W
        r *= np.sqrt(5.0)
        return _poly_times_exp((5.0 / 3.0) * (1.0 + r), r)


def _times_weight(W, D2):
    """W · D2 with 0 where W = 0: at infinite distance W r² → 0, where IEEE's 0 · inf is NaN."""
    with np.errstate(invalid="ignore"):
        return np.where(W == 0.0, 0.0, W * D2)


def _poly_times_exp(poly, r):
    """poly · e^{−r}, with its limit 0 where e^{−r} = 0 (r = inf: IEEE's inf · 0 is NaN)."""
    K = np.exp(-r)
    with np.errstate(invalid="ignore"):
        K *= poly
    K[np.isnan(K) & (r == np.inf)] = 0.0
    return K


# ----------------------------------------------------------------------------------------------
# other leaf kernels


class ConstantKernel(Kernel):
    r"""Constant kernel :math:`k(x, y) = c`.

    Parameters
    ----------
    constant_value : float, default 1.0
    constant_value_bounds : pair of floats or "fixed", default (1e-5, 1e5)

    Notes
    -----
    :math:`\partial k / \partial \log c = c`.
    """

    _hyper = ("constant_value",)

    def __init__(self, constant_value=1.0, constant_value_bounds=(1e-5, 1e5)):
        self.constant_value = constant_value
        self.constant_value_bounds = constant_value_bounds
        self._validate()

    def _validate(self):
        super()._validate()
        if np.size(self.constant_value) != 1:
            raise ValueError("constant_value must be a scalar")

    def _free(self):
        return self._hyper_entries()[0][2] is not None

    def _call(self, X, Y, eval_gradient):
        c = float(self.constant_value)
        m = X.shape[0] if Y is None else Y.shape[0]
        K = np.full((X.shape[0], m), c)
        if eval_gradient:
            return K, (K[:, :, None].copy() if self._free() else np.empty(K.shape + (0,)))
        return K

    def _diag(self, X):
        return np.full(X.shape[0], float(self.constant_value))

    def _contract(self, X, M, K=None, symmetric=False):
        return np.array([float(self.constant_value) * M.sum()]) if self._free() else np.empty(0)

    def _constant(self):
        return float(self.constant_value)

    def _grad_inputs(self, X, Y, M):
        return np.zeros_like(X)


class WhiteKernel(Kernel):
    r"""White-noise kernel :math:`k(x_i, x_j) = \sigma^2 \delta_{ij}`.

    The noise is on the diagonal of K(X, X) only: when Y is None or ``Y is X``.  For any other Y
    (even one equal to X) K(X, Y) is zero, since distinct data are independent draws.

    Parameters
    ----------
    noise_level : float, default 1.0
        :math:`\sigma^2`.
    noise_level_bounds : pair of floats or "fixed", default (1e-5, 1e5)
    """

    _hyper = ("noise_level",)

    def __init__(self, noise_level=1.0, noise_level_bounds=(1e-5, 1e5)):
        self.noise_level = noise_level
        self.noise_level_bounds = noise_level_bounds
        self._validate()

    def _validate(self):
        super()._validate()
        if np.size(self.noise_level) != 1:
            raise ValueError("noise_level must be a scalar")

    def _free(self):
        return self._hyper_entries()[0][2] is not None

    def _call(self, X, Y, eval_gradient):
        s = float(self.noise_level)
        if Y is not None:
            return np.zeros((X.shape[0], Y.shape[0]))
        K = s * np.eye(X.shape[0])
        if eval_gradient:
            return K, (K[:, :, None].copy() if self._free() else np.empty(K.shape + (0,)))
        return K

    def _diag(self, X):
        return np.full(X.shape[0], float(self.noise_level))

    def _diagonal(self):
        return True

    def _contract(self, X, M, K=None, symmetric=False):
        return np.array([float(self.noise_level) * np.trace(M)]) if self._free() else np.empty(0)

    def _grad_inputs(self, X, Y, M):
        return np.zeros_like(X)


class Linear(Kernel):
    r"""Linear kernel :math:`k(x, y) = v \, x^\top y`.

    Parameters
    ----------
    variance : float, default 1.0
        :math:`v`.
    variance_bounds : pair of floats or "fixed", default (1e-5, 1e5)

    Notes
    -----
    :math:`\partial k / \partial \log v = k`; :math:`\partial k / \partial x_d = v \, y_d`.
    Equals scikit-learn's ``ConstantKernel(v) * DotProduct(sigma_0=0)``.
    """

    _hyper = ("variance",)

    def __init__(self, variance=1.0, variance_bounds=(1e-5, 1e5)):
        self.variance = variance
        self.variance_bounds = variance_bounds
        self._validate()

    def _validate(self):
        super()._validate()
        if np.size(self.variance) != 1:
            raise ValueError("variance must be a scalar")

    def _free(self):
        return self._hyper_entries()[0][2] is not None

    def _call(self, X, Y, eval_gradient):
        v = float(self.variance)
        K = X @ (X if Y is None else Y).T
        K *= v
        if Y is None:
            K += K.T
            K *= 0.5
        _check_no_overflow(self, K, X, Y)
        if eval_gradient:
            return K, (K[:, :, None].copy() if self._free() else np.empty(K.shape + (0,)))
        return K

    def _diag(self, X):
        return _check_no_overflow(self, float(self.variance) * np.einsum("ij,ij->i", X, X), X)

    def _contract(self, X, M, K=None, symmetric=False):
        if not self._free():
            return np.empty(0)
        # sum_ij M_ij v x_i.x_j = v sum(X o (M X)): O(n^2 d), no n x n temporary
        return np.array([float(self.variance) * np.vdot(X, M @ X)])

    def _grad_inputs(self, X, Y, M):
        return float(self.variance) * (M @ Y)

    def is_stationary(self):
        return False


def _check_no_overflow(kernel, values, X, Y=None):
    """``values`` if finite; else a ValueError naming the kernel and the input size that overflows.

    The Linear and Polynomial kernels grow with |x|: inputs of size ~1e155 (Linear) give values
    beyond float64, and a predictive variance inf − inf would be NaN further on (issue 17)."""
    if np.all(np.isfinite(values)):
        return values
    biggest = max(float(np.max(np.abs(X))), 0.0 if Y is None else float(np.max(np.abs(Y))))
    raise ValueError(f"{type(kernel).__name__} kernel values overflow float64 for inputs as large as "
                     f"{biggest:.3g}; rescale the inputs (e.g. standardise them)")


class Polynomial(Kernel):
    r"""Polynomial kernel :math:`k(x, y) = (1 + x^\top y / s)^p`.

    With ``scale=None`` the scale is s = n_features, the mean-field paper's
    :math:`(1 + x^\top x' / m)^k`.  Neither the degree p nor the scale s is a hyperparameter:
    this kernel has an empty ``theta``.  Multiply by a :class:`ConstantKernel` for an amplitude.

    Parameters
    ----------
    degree : int >= 1, default 2
    scale : float > 0 or None, default None

    Notes
    -----
    :math:`\partial k / \partial x_d = p (1 + x^\top y / s)^{p-1} y_d / s`.
    """

    def __init__(self, degree=2, scale=None):
        self.degree = degree
        self.scale = scale
        self._validate()

    def _validate(self):
        d = self.degree
        if not isinstance(d, numbers.Integral) or isinstance(d, bool) or d < 1:
            raise ValueError(f"degree must be an integer >= 1, got {d!r}")
        if self.scale is not None:
            _check_positive_values(self.scale, "scale")
            if np.size(self.scale) != 1:
                raise ValueError("scale must be a scalar or None")

    def _s(self, X):
        return float(X.shape[1]) if self.scale is None else float(self.scale)

    def _base(self, X, Y):
        B = X @ (X if Y is None else Y).T
        B /= self._s(X)
        B += 1.0
        if Y is None:
            B += B.T
            B *= 0.5
        return B

    def _call(self, X, Y, eval_gradient):
        with np.errstate(over="ignore", invalid="ignore"):
            K = self._base(X, Y) ** int(self.degree)
        _check_no_overflow(self, K, X, Y)
        if eval_gradient:
            return K, np.empty(K.shape + (0,))
        return K

    def _diag(self, X):
        with np.errstate(over="ignore"):
            d = (1.0 + np.einsum("ij,ij->i", X, X) / self._s(X)) ** int(self.degree)
        return _check_no_overflow(self, d, X)

    def _contract(self, X, M, K=None, symmetric=False):
        return np.empty(0)

    def _grad_inputs(self, X, Y, M):
        p = int(self.degree)
        B = self._base(X, Y)
        A = B ** (p - 1) if p > 1 else np.ones_like(B)
        A *= M
        return (p / self._s(X)) * (A @ Y)

    def is_stationary(self):
        return False


# ----------------------------------------------------------------------------------------------
# composition


class _Binary(Kernel):
    def __init__(self, k1, k2):
        self.k1 = k1
        self.k2 = k2
        self._validate()

    def _validate(self):
        for name in ("k1", "k2"):
            if not _is_kernel_like(getattr(self, name)):
                raise ValueError(f"{name} must be a kernel, got {getattr(self, name)!r}")

    @property
    def _a(self):
        return as_kernel(self.k1)

    @property
    def _b(self):
        return as_kernel(self.k2)

    @property
    def theta(self):
        return np.concatenate([self._a.theta, self._b.theta])

    @theta.setter
    def theta(self, theta):
        theta = self._check_theta(theta)
        p = self._a.n_dims
        self.k1.theta = theta[:p]
        self.k2.theta = theta[p:]

    @property
    def bounds(self):
        return np.vstack([np.reshape(self._a.bounds, (-1, 2)), np.reshape(self._b.bounds, (-1, 2))])

    @property
    def hyperparameter_names(self):
        return ([f"k1__{n}" for n in self._a.hyperparameter_names]
                + [f"k2__{n}" for n in self._b.hyperparameter_names])

    def is_stationary(self):
        return self._a.is_stationary() and self._b.is_stationary()


class Sum(_Binary):
    r"""Sum of two kernels, :math:`k = k_1 + k_2`; ``theta`` is ``k1.theta`` then ``k2.theta``.

    Parameters
    ----------
    k1, k2 : Kernel
        The two terms (``k1 + k2`` builds the same).
    """

    def _call(self, X, Y, eval_gradient):
        a, b = self._a, self._b
        if not eval_gradient:
            return a(X, Y) + b(X, Y)
        K1, G1 = a(X, eval_gradient=True)
        K2, G2 = b(X, eval_gradient=True)
        return K1 + K2, np.concatenate([G1, G2], axis=2)

    def _diag(self, X):
        return self._a.diag(X) + self._b.diag(X)

    def _contract(self, X, M, K=None, symmetric=False):
        a, b = self._a, self._b
        Ka = K if K is not None and b._diagonal() else None
        Kb = K if K is not None and a._diagonal() else None
        return np.concatenate([a._contract(X, M, K=Ka, symmetric=symmetric),
                               b._contract(X, M, K=Kb, symmetric=symmetric)])

    def _grad_inputs(self, X, Y, M):
        return self._a.gradient_inputs(X, Y, M) + self._b.gradient_inputs(X, Y, M)

    def __repr__(self):
        return f"{self.k1!r} + {self.k2!r}"


class Product(_Binary):
    r"""Product of two kernels, :math:`k = k_1 k_2`; ``theta`` is ``k1.theta`` then ``k2.theta``.

    :math:`\sum_{ij} M_{ij} \partial (K_1 \circ K_2)_{ij} / \partial\theta_1
    = \sum_{ij} (M \circ K_2)_{ij} \partial K_{1,ij} / \partial\theta_1`, and likewise for
    :math:`\theta_2` and for the inputs.

    Parameters
    ----------
    k1, k2 : Kernel
        The two factors (``k1 * k2`` builds the same).
    """

    def _call(self, X, Y, eval_gradient):
        a, b = self._a, self._b
        if not eval_gradient:
            ca, cb = a._constant(), b._constant()
            if ca is not None or cb is not None:   # a constant factor scales, no n x n of it
                return b._call_times(X, Y, ca) if ca is not None else a._call_times(X, Y, cb)
            K = a(X, Y)
            K *= b(X, Y)
            return K
        K1, G1 = a(X, eval_gradient=True)
        K2, G2 = b(X, eval_gradient=True)
        return K1 * K2, np.concatenate([G1 * K2[:, :, None], G2 * K1[:, :, None]], axis=2)

    def _diag(self, X):
        return self._a.diag(X) * self._b.diag(X)

    def _contract(self, X, M, K=None, symmetric=False):
        # each factor's own K is computed once and handed to its contraction (an RBF then reuses it
        # instead of recomputing distances and exponentials); a constant factor scales M instead of
        # being expanded into an n x n matrix
        a, b = self._a, self._b
        ca, cb = a._constant(), b._constant()
        if (ca is None) != (cb is None):
            # c * k: d/dlog c = c sum M o K_k and d/dtheta_k = c sum M o dK_k, both from one pass of k
            c, const, other = (ca, a, b) if ca is not None else (cb, b, a)
            g_other, value = other._contract_value(X, M, K, c, symmetric)
            g_const = np.array([c * value]) if const.n_dims else np.empty(0)
            parts = (g_const, c * np.asarray(g_other)) if ca is not None else (c * np.asarray(g_other), g_const)
            return np.concatenate(parts)
        Ka = None if ca is not None else a(X)
        Kb = None if cb is not None else b(X)
        parts = []
        if a.n_dims:
            parts.append(a._contract(X, M * (cb if Kb is None else Kb), K=Ka, symmetric=symmetric))
        if b.n_dims:
            parts.append(b._contract(X, M * (ca if Ka is None else Ka), K=Kb, symmetric=symmetric))
        return np.concatenate(parts) if parts else np.empty(0)

    def _grad_inputs(self, X, Y, M):
        a, b = self._a, self._b
        MK = b(X, Y)
        MK *= M
        G = a.gradient_inputs(X, Y, MK)
        MK = a(X, Y)
        MK *= M
        G += b.gradient_inputs(X, Y, MK)
        return G

    def __repr__(self):
        return f"{self.k1!r} * {self.k2!r}"


# ----------------------------------------------------------------------------------------------
# foreign kernels


class _ForeignKernel(Kernel):
    """Adapter giving a scikit-learn-interface kernel gpc's interface.

    scikit-learn's standard kernels (RBF, Matern with ν ∈ {0.5, 1.5, 2.5, ∞}, ConstantKernel,
    WhiteKernel, DotProduct, RationalQuadratic and their sums, products and powers) are translated to
    gpc kernels of the same formula (:func:`_translate`), which evaluate K and contract gradients
    without the (n, n, p) tensor (the stationary ones in gpc._kernels, RationalQuadratic in NumPy); θ, bounds and names stay the scikit-learn kernel's (its θ order is k1's then
    k2's, leaf by leaf, as gpc's).  Any other kernel is called as is, and ``gradient_contract``
    forms its gradient tensor and contracts it with einsum: correct, but O(n² p) memory.
    Cross-covariances K(X, Y) always come from the scikit-learn kernel itself (WhiteKernel(X, Y)
    is zero there even when Y is X).  A kernel with ``requires_vector_input = False`` (strings,
    graphs) receives its inputs unconverted.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self._fast = _translate(kernel)

    @property
    def theta(self):
        return np.asarray(self.kernel.theta, dtype=float)

    @theta.setter
    def theta(self, theta):
        self.kernel.theta = self._check_theta(theta)
        self._fast = _translate(self.kernel)

    @property
    def bounds(self):
        return np.reshape(np.asarray(self.kernel.bounds, dtype=float), (-1, 2))

    @property
    def hyperparameter_names(self):
        names = []
        for h in getattr(self.kernel, "hyperparameters", []):
            if getattr(h, "fixed", False):
                continue
            n = getattr(h, "n_elements", 1)
            names.extend([h.name] if n == 1 else [f"{h.name}[{i}]" for i in range(n)])
        if len(names) != self.n_dims:
            names = [f"theta[{i}]" for i in range(self.n_dims)]
        return names

    def _check_bounds_params(self):
        """The scikit-learn kernel's own warning (scikit-learn's ConvergenceWarning and message)."""
        own = getattr(self.kernel, "_check_bounds_params", None)
        return own() if callable(own) else super()._check_bounds_params()

    def clone_with_theta(self, theta):
        return _ForeignKernel(self.kernel.clone_with_theta(self._check_theta(theta)))

    def _vector_input(self):
        return getattr(self.kernel, "requires_vector_input", True)

    def __call__(self, X, Y=None, eval_gradient=False):
        if Y is not None or not self._vector_input():
            return self.kernel(X, Y, eval_gradient=eval_gradient) if eval_gradient else self.kernel(X, Y)
        return super().__call__(X, None, eval_gradient)

    def diag(self, X):
        return super().diag(X) if self._vector_input() else self.kernel.diag(X)

    def gradient_contract(self, X, M, K=None, symmetric=False):
        if self._vector_input():
            return super().gradient_contract(X, M, K=K, symmetric=symmetric)
        M = _check_M(M, (len(X), len(X)))
        return _check_result(self._contract(X, M), M)

    def _call(self, X, Y, eval_gradient):
        if self._fast is not None and Y is None:
            return self._fast._call(X, None, eval_gradient)
        return self.kernel(X, Y, eval_gradient=eval_gradient) if eval_gradient else self.kernel(X, Y)

    def _diag(self, X):
        return self.kernel.diag(X) if self._fast is None else self._fast._diag(X)

    def _contract(self, X, M, K=None, symmetric=False):
        if self._fast is not None:
            return self._fast._contract(X, M, K=K, symmetric=symmetric)
        _, dK = self.kernel(X, eval_gradient=True)
        return np.einsum("ij,ijk->k", M, dK)

    def _contract_value(self, X, M, K=None, scale=1.0, symmetric=False):
        if self._fast is not None:
            return self._fast._contract_value(X, M, K=K, scale=scale, symmetric=symmetric)
        return super()._contract_value(X, M, K=K, scale=scale, symmetric=symmetric)

    def _constant(self):
        return None if self._fast is None else self._fast._constant()

    def _diagonal(self):
        return self._fast is not None and self._fast._diagonal()

    def _grad_inputs(self, X, Y, M):
        if self._fast is not None:
            return self._fast._grad_inputs(X, Y, M)
        raise NotImplementedError(
            f"gradient_inputs is not available for the foreign kernel {self.kernel!r}; "
            "use a gpc kernel to optimise inducing inputs")

    def is_stationary(self):
        f = getattr(self.kernel, "is_stationary", None)
        return bool(f()) if callable(f) else False

    def __repr__(self):
        return f"as_kernel({self.kernel!r})"


class _DotProductOffset(ConstantKernel):
    """scikit-learn DotProduct's σ0² as a constant whose θ is log σ0: ∂σ0²/∂log σ0 = 2σ0²."""

    def _contract(self, X, M, K=None, symmetric=False):
        return 2.0 * super()._contract(X, M, K=K, symmetric=symmetric)


class _Power(Kernel):
    r"""scikit-learn's Exponentiation, :math:`k = b^p` with the base's θ:
    :math:`\sum_{ij} M_{ij} \partial k_{ij} = \sum_{ij} (M \circ p\, b^{p-1})_{ij} \partial b_{ij}`."""

    def __init__(self, base, exponent):
        self.base = base
        self.exponent = float(exponent)

    @property
    def theta(self):
        return self.base.theta

    @theta.setter
    def theta(self, theta):
        self.base.theta = theta

    @property
    def bounds(self):
        return self.base.bounds

    def _call(self, X, Y, eval_gradient):
        p = self.exponent
        if not eval_gradient:
            return self.base._call(X, Y, False) ** p
        Kb, Gb = self.base._call(X, None, True)
        return Kb ** p, (p * Kb ** (p - 1))[:, :, None] * Gb

    def _diag(self, X):
        return self.base._diag(X) ** self.exponent

    def _contract(self, X, M, K=None, symmetric=False):
        Kb = self.base._call(X, None, False)
        return self.base._contract(X, M * (self.exponent * Kb ** (self.exponent - 1)), K=Kb,
                                   symmetric=symmetric)

    def is_stationary(self):
        return self.base.is_stationary()


class _RationalQuadratic(Kernel):
    r"""scikit-learn's RationalQuadratic, :math:`k = (1 + d / (2 \alpha \ell^2))^{-\alpha}`,
    d = |x - y|², in NumPy: θ = (log α, log ℓ) (scikit-learn's order), free ones only, with

    :math:`\partial k / \partial \log\ell = (d / \ell^2)\, b^{-\alpha - 1}`,
    :math:`\partial k / \partial \log\alpha = k\,(-\alpha \log b + d / (2 \ell^2 b))`, b = 1 + d/(2αℓ²).
    """

    def __init__(self, alpha, length_scale, free_alpha, free_length_scale):
        self.alpha, self.length_scale = float(alpha), float(length_scale)
        self.free = (free_alpha, free_length_scale)

    @property
    def theta(self):
        values = np.log([self.alpha, self.length_scale])
        return values[np.array(self.free)]

    @theta.setter
    def theta(self, theta):
        values = np.log([self.alpha, self.length_scale])
        values[np.array(self.free)] = self._check_theta(theta)
        self.alpha, self.length_scale = np.exp(values)

    @property
    def bounds(self):
        return np.zeros((int(sum(self.free)), 2))

    def _parts(self, X, Y):
        U = X - X.mean(axis=0)
        D = _sqdist(U, None if Y is None else Y - X.mean(axis=0))
        base = 1.0 + D / (2.0 * self.alpha * self.length_scale ** 2)
        return D, base, base ** -self.alpha

    def _call(self, X, Y, eval_gradient):
        D, base, K = self._parts(X, Y)
        if not eval_gradient:
            return K
        grads = self._gradients(D, base, K)
        return K, (np.stack(grads, axis=2) if grads else np.empty(K.shape + (0,)))

    def _gradients(self, D, base, K):
        a, ls = self.alpha, self.length_scale
        out = []
        if self.free[0]:
            out.append(K * (-a * np.log(base) + D / (2.0 * ls ** 2 * base)))
        if self.free[1]:
            out.append(D / ls ** 2 * base ** (-a - 1.0))
        return out

    def _diag(self, X):
        return np.ones(X.shape[0])

    def _contract(self, X, M, K=None, symmetric=False):
        D, base, Kx = self._parts(X, None)
        return np.array([np.vdot(M, G) for G in self._gradients(D, base, Kx)])


def _translate(kernel):
    """The gpc kernel computing scikit-learn's ``kernel`` (same formula, same θ order), or None.

    Classes are recognised by their scikit-learn module and name, so a subclass (which may change
    the formula) keeps the generic path.  Matern with ν = ∞ is the squared exponential.
    """
    kind = type(kernel)
    if kind.__module__ != "sklearn.gaussian_process.kernels":
        return None
    name = kind.__name__
    try:
        if name in ("Sum", "Product"):
            a, b = _translate(kernel.k1), _translate(kernel.k2)
            if a is None or b is None:
                return None
            return Sum(a, b) if name == "Sum" else Product(a, b)
        if name == "RBF" or (name == "Matern" and np.isinf(kernel.nu)):
            return RBF(kernel.length_scale, kernel.length_scale_bounds)
        if name == "Matern" and kernel.nu in (0.5, 1.5, 2.5):
            return Matern(kernel.length_scale, kernel.length_scale_bounds, nu=float(kernel.nu))
        if name == "ConstantKernel":
            return ConstantKernel(kernel.constant_value, kernel.constant_value_bounds)
        if name == "WhiteKernel":
            return WhiteKernel(kernel.noise_level, kernel.noise_level_bounds)
        if name == "DotProduct":   # σ0² + x·y
            bounds = kernel.sigma_0_bounds
            bounds = bounds if isinstance(bounds, str) else np.square(np.asarray(bounds, dtype=float))
            return Sum(_DotProductOffset(kernel.sigma_0 ** 2, bounds), Linear(1.0, "fixed"))
        if name == "Exponentiation":
            base = _translate(kernel.kernel)
            return None if base is None else _Power(base, kernel.exponent)
        if name == "RationalQuadratic":
            return _RationalQuadratic(kernel.alpha, kernel.length_scale,
                                      not kernel.hyperparameter_alpha.fixed,
                                      not kernel.hyperparameter_length_scale.fixed)
    except (ValueError, TypeError):   # a parameter gpc's kernel does not take (e.g. infinite bounds)
        return None
    return None


def user_kernel(kernel):
    """The kernel as the user gave it: the scikit-learn object inside gpc's adapter, else ``kernel``.

    Parameters
    ----------
    kernel : Kernel
        A kernel, possibly the adapter :func:`as_kernel` made.
    """
    return kernel.kernel if isinstance(kernel, _ForeignKernel) else kernel


def _reads_lower_triangle_only(kernel):
    """Whether ``kernel.gradient_contract(X, M, K, symmetric=True)`` reads no more of M than its
    lower triangle: a stationary kernel, alone or times a constant (a translated scikit-learn one
    too).  The evidence gradient then skips mirroring M (conservative: False for anything else)."""
    def inner(k):
        return k._fast if isinstance(k, _ForeignKernel) and k._fast is not None else k

    k = inner(kernel)
    if isinstance(k, Product):
        ca, cb = k._a._constant(), k._b._constant()
        if (ca is None) != (cb is None):
            k = inner(k._b if ca is not None else k._a)
    return isinstance(k, _Stationary)


def as_kernel(kernel):
    """Return ``kernel`` with gpc's interface.

    A gpc :class:`Kernel` is returned as is; any object with the scikit-learn kernel interface
    (``theta``, ``bounds``, ``__call__(X, Y=None, eval_gradient=False)``, ``diag``,
    ``clone_with_theta``) is wrapped in an adapter that runs scikit-learn's standard kernels on
    gpc's compiled ones and any other through its own ``__call__`` (see :class:`_ForeignKernel`).

    Parameters
    ----------
    kernel : Kernel or scikit-learn kernel
        The kernel to adapt.
    """
    if isinstance(kernel, Kernel):
        return kernel
    if not callable(kernel) or not _is_kernel_like(kernel):
        raise TypeError(f"{kernel!r} is not a kernel: it needs theta, bounds, __call__, diag "
                        "and clone_with_theta")
    return _ForeignKernel(kernel)
