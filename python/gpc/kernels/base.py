"""The kernel base class: hyperparameters in log space, parameters, validation, the interface.

What every gpc kernel shares: ``theta`` (log of the free hyperparameters) and its ``bounds``,
``get_params`` / ``set_params`` from the constructor, ``clone_with_theta``, the checked entry points
(``__call__``, ``diag``, ``gradient_contract``, ``gradient_inputs``) around the subclasses' private
methods, and ``+`` / ``*`` building :class:`gpc.kernels.Sum` and :class:`gpc.kernels.Product`.
"""

import copy
import functools
import inspect
import math
import warnings

import numpy as np

from .._validation import check_finite_array
from ..exceptions import ConvergenceWarning


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


def _check_XZ(X, Z):
    """X (b, d) and Z (m, d): finite 2-D arrays of the same width."""
    X, Z = _check_X(X), _check_X(Z, "Z")
    if Z.shape[1] != X.shape[1]:
        raise ValueError(f"X has {X.shape[1]} features but Z has {Z.shape[1]}")
    return X, Z


#: rows of X per stacked contraction in the general cross gradient (its matrix is (rows + m)²)
_STACK_ROWS = 256


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



def _check_positive_values(value, name):
    if type(value) is float and 0.0 < value < math.inf:     # the common case, without NumPy's checks
        return np.array([value])
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number or array of them, got {value!r}") from None
    if arr.ndim > 1 or arr.size == 0:
        raise ValueError(f"{name} must be a scalar or a non-empty 1-D array, got shape {arr.shape}")
    # one pass for the valid case (a NaN fails both comparisons); the messages come after
    if not ((arr > 0.0) & (arr < np.inf)).all():
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} must be finite, got {value!r}")
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return arr.reshape(-1)


def _check_bounds(bounds, name, n):
    """Return log-bounds of shape (n, 2), or None when fixed."""
    if isinstance(bounds, str):
        if bounds == "fixed":
            return None
        raise ValueError(f"{name} must be a (low, high) pair or 'fixed', got {bounds!r}")
    if type(bounds) is tuple and len(bounds) == 2 and all(type(v) is float for v in bounds):
        low, high = bounds                      # the common case, without NumPy's checks
        if 0.0 < low <= high < math.inf:
            return np.log(np.array([[low, high]] * n))
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


#: number types whose values cannot change in place
_IMMUTABLE_NUMBERS = frozenset((float, int, np.float64, np.float32, np.int64, np.int32))


def _snapshot(value):
    """What a hyperparameter's or bounds' current value is, comparable with ``==``: an immutable
    value (a number, a string, a tuple of numbers) itself, an array its type, dtype, shape and
    bytes (so that an in-place write shows); None for anything else (a list, an object)."""
    kind = type(value)
    if kind in _IMMUTABLE_NUMBERS or kind is str:
        return (kind, value)
    if kind is np.ndarray:
        return (kind, value.dtype.str, value.shape, value.tobytes())
    if kind is tuple and all(type(v) in _IMMUTABLE_NUMBERS for v in value):
        return (kind, tuple(map(type, value)), value)
    return None


#: kernel classes whose shallow copy is a new instance with the same __dict__ (no __copy__,
#: __reduce__, __getstate__ or __setstate__ of their own, no __slots__)
_PLAIN_COPY: dict[type, bool] = {}


def _shallow_copy(obj):
    """``copy.copy(obj)`` for a kernel: for a class that copies as a plain object (checked once
    per class), its instance made with ``__new__`` and given a copy of ``obj.__dict__``, which is
    what ``copy.copy`` does for it, without the copy protocol's lookups."""
    cls = type(obj)
    plain = _PLAIN_COPY.get(cls)
    if plain is None:
        plain = (cls.__reduce_ex__ is object.__reduce_ex__ and cls.__reduce__ is object.__reduce__
                 and getattr(cls, "__getstate__", object.__getstate__) is object.__getstate__
                 and not hasattr(cls, "__copy__") and not hasattr(cls, "__setstate__")
                 and not any("__slots__" in vars(c) for c in cls.__mro__))
        _PLAIN_COPY[cls] = plain
    if not plain:
        return copy.copy(obj)
    new = cls.__new__(cls)
    new.__dict__.update(obj.__dict__)
    return new


def _read_only(arr):
    """A read-only view of ``arr`` (None stays None): entries kept between reads must not be
    written by their readers."""
    if arr is None:
        return None
    view = arr.view()
    view.flags.writeable = False
    return view


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


@functools.lru_cache(maxsize=None)
def _init_parameters(init):
    """The named parameters of a constructor (a class's signature does not change: cached)."""
    sig = inspect.signature(init)
    return tuple(p.name for p in sig.parameters.values()
                 if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


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

    def _reads_lower_triangle(self):
        """Whether ``gradient_contract(X, M, K, symmetric=True)`` reads no more of M than its lower
        triangle (the evidence gradient then skips mirroring M); conservative: False unless a
        kernel says so."""
        return False

    def _diagonal(self):
        """Whether K(X, X) is diagonal (white noise): in a sum, the other term's K(X, X) then equals
        the sum's off the diagonal, which is all a contraction reads of a K handed to it."""
        return False

    def _gram_is_cross(self):
        """Whether K(X) equals the cross block K(X, X) of distinct draws (no white-noise part on
        its diagonal): :meth:`_gram_gradient` then needs one cross contraction; conservative: False
        unless a kernel says so."""
        return False

    def _gram_gradient(self, Z, G, K):
        """(∂F/∂θ, ∂F/∂Z or None) for F = Σ G ∘ K(Z) with G symmetric (m x m, C-contiguous, used
        as scratch) and ``K`` = K(Z).

        K(Z) depends on Z through both arguments and G is symmetric, so ∂F/∂Z is twice the
        derivative through the second argument, which :meth:`_cross_gradient` gives.  When K(Z) is
        the cross block K(Z, Z) (:meth:`_gram_is_cross`) the same call gives ∂F/∂θ from ``K``;
        otherwise (white noise on the diagonal) θ's part is :meth:`_contract` of K(Z)."""
        if self._gram_is_cross():
            g_theta, g_Z, _ = self._cross_gradient(Z, Z, G, None, K, overwrite=True)
        else:
            g_theta = self._contract(Z, G, K=K, symmetric=True)
            _, g_Z, _ = self._cross_gradient(Z, Z, G, None, overwrite=True)
        return g_theta, None if g_Z is None else 2.0 * g_Z

    # -- parameters (constructor arguments) -----------------------------------------------------

    @classmethod
    def _param_names(cls):
        return list(_init_parameters(cls.__init__))

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
        """List of (name, values 1-D, log-bounds (n,2) or None) for each leaf hyperparameter
        (read-only arrays).

        Validated once per value: the entries are kept with a snapshot of the attributes they
        came from (:func:`_snapshot`: the value itself, or an array's bytes) and made again when
        any attribute differs from its snapshot, however it was changed (``set_params``, plain
        assignment, an in-place write to an array).  A fit reads θ and its bounds many times
        per step between changes.  An attribute that is still the very object the snapshot was
        taken of, and not an array, is unchanged without a new snapshot (the values that
        :func:`_snapshot` keeps by value cannot change in place)."""
        cached = self.__dict__.get("_hyper_cache")
        if cached is not None and self._hyper_unchanged(*cached[0]):
            return cached[1]
        state = self._hyper_key()
        out = []
        for h in self._hyper:
            vals = _check_positive_values(getattr(self, h), h)
            out.append((h, _read_only(vals),
                        _read_only(_check_bounds(getattr(self, h + "_bounds"), h + "_bounds",
                                                 vals.size))))
        if state is not None:
            self.__dict__["_hyper_cache"] = (state, out)
        return out

    def _hyper_key(self):
        """(the snapshots of every hyperparameter and its bounds (:func:`_snapshot`), the
        attribute objects they were taken of), or None when one cannot be taken cheaply (then
        nothing is kept)."""
        key, objects = [], []
        for h in self._hyper:
            for value in (getattr(self, h), getattr(self, h + "_bounds")):
                snap = _snapshot(value)
                if snap is None:
                    return None
                key.append(snap)
                objects.append(value)
        return tuple(key), tuple(objects)

    def _hyper_unchanged(self, key, objects):
        """Whether every hyperparameter and its bounds still match ``key`` (:meth:`_hyper_key`)."""
        i = 0
        for h in self._hyper:
            for value in (getattr(self, h), getattr(self, h + "_bounds")):
                if (value is not objects[i] or type(value) is np.ndarray) and \
                        _snapshot(value) != key[i]:
                    return False
                i += 1
        return True

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

    # -- blocks between rows X (b) and inducing points Z (m): what the sparse engine asks ----------

    def cross_covariance(self, X, Z):
        """K(X, Z) as a C-ordered float64 array of shape (b, m).

        The squared exponential (alone or times a constant) computes it in one b x d x m product,
        one compiled pass and one vectorised exponential; other kernels through ``__call__``.
        """
        X, Z = _check_XZ(X, Z)
        return self._cross(X, Z)

    def cross_gradient(self, X, Z, G, diag_weights=None, K=None):
        r"""Gradients of F = Σ_ij G_ij k(x_i, z_j) + Σ_i w_i k(x_i, x_i) in θ (log space) and in Z.

        Parameters
        ----------
        X : array of shape (b, d)
        Z : array of shape (m, d)
        G : array of shape (b, m)
        diag_weights : array of shape (b,), optional
            w, the weights of the diagonal terms k(x_i, x_i) (zero when None).
        K : array of shape (b, m), optional
            K(X, Z) when the caller holds it (its values are then not recomputed).

        Returns
        -------
        g_theta : array of shape (n_dims,)
            :math:`\sum_{ij} G_{ij} \partial K_{ij} / \partial\theta_k + \sum_i w_i \partial
            k_{ii} / \partial\theta_k`.
        g_Z : array of shape (m, d), or None
            :math:`\sum_i G_{ij} \partial k(x_i, z_j) / \partial z_{jd}` (None for a kernel with
            no gradient in its inputs).

        Notes
        -----
        Stationary kernels work on the b x m block alone: with A = G ∘ W, W = -f'(r)/r and inputs
        scaled by the length-scales, :math:`\partial F/\partial\log\ell_d = \sum_{ij}
        A_{ij} (u_{id} - v_{jd})^2` and :math:`\partial F/\partial z_{jd} = \sum_i A_{ij}
        (u_{id} - v_{jd}) / \ell_d`; other kernels contract their (b + m)-square matrix over the
        stacked inputs a few rows at a time.
        """
        X, Z = _check_XZ(X, Z)
        G = _check_M(G, (X.shape[0], Z.shape[0]), name="G")
        if diag_weights is not None:
            diag_weights = check_finite_array(diag_weights, "diag_weights", ndim=1)
            if diag_weights.shape[0] != X.shape[0]:
                raise ValueError(f"diag_weights has {diag_weights.shape[0]} entries for "
                                 f"{X.shape[0]} rows")
        if K is not None:
            K = _check_M(K, G.shape, name="K")
        g_theta, g_Z, _ = self._cross_gradient(X, Z, G, diag_weights, K)
        return _check_result(g_theta, G, K), g_Z

    def _bound_to(self, Z):
        """The kernel's blocks against the inducing inputs Z (m x d, checked, C-ordered float64):
        a :class:`BoundKernel`, which the sparse engine asks for K_uu, K_bu by chunks of rows, diag
        K_bb and their gradients.  Kernels with a compiled path return their own bound object."""
        return BoundKernel(self, Z)

    def _noise_split(self, Z):
        """(the compiled bound object of k bound to Z, a :class:`gpc.kernels.WhiteKernel`, whether
        the noise is the first term, k) when this kernel is k + white noise and k has a compiled
        bound (:class:`BoundKernel` then takes k's blocks from it); None otherwise."""
        return None

    def _bound_scaled(self, Z, scale, constant):
        """The compiled bound object of scale · k, this kernel times a product's constant factor
        (``constant``: where a free log c of that factor sits in the product's θ, "first" or
        "last", or None when it is fixed); None when this kernel has no compiled path (the product
        then binds itself generically)."""
        return None

    def _cross(self, X, Z, scale=1.0):
        """scale · K(X, Z) on checked inputs (a constant factor of a product passes its value)."""
        K = np.array(self._call(X, Z, False), dtype=np.float64, order="C")
        if scale != 1.0:
            K *= scale
        return K

    def _cross_gradient(self, X, Z, G, w, K=None, scale=1.0, overwrite=False):
        """(∂F/∂θ, ∂F/∂Z or None, F) for F = scale · (Σ G ∘ K(X, Z) + Σ w ∘ diag K(X, X)).

        ``K``, when given, is scale · K(X, Z); with ``overwrite`` G may serve as scratch.  Here the
        general path: the symmetric matrix [[diag w, G/2], [Gᵀ/2, 0]] contracted over the stacked
        inputs [X_c; Z] for row chunks X_c of _STACK_ROWS rows (Σ of the chunks is the total), and
        ``_grad_inputs`` for Z."""
        b, m = G.shape
        if K is None:
            K = self._cross(X, Z, scale)
        value = float(np.vdot(G, K))
        if w is not None:
            value += scale * float(w @ self._diag(X))
        g_theta = np.zeros(self.n_dims)
        for a in range(0, b, _STACK_ROWS):
            c = min(a + _STACK_ROWS, b)
            k = c - a
            M = np.zeros((k + m, k + m))
            if w is not None:
                M[np.arange(k), np.arange(k)] = w[a:c]
            M[:k, k:] = 0.5 * G[a:c]
            M[k:, :k] = 0.5 * G[a:c].T
            g_theta += self._contract(np.vstack([X[a:c], Z]), M, symmetric=True)
        try:
            g_Z = scale * self._grad_inputs(Z, X, np.ascontiguousarray(G.T))
        except NotImplementedError:
            g_Z = None
        return scale * g_theta, g_Z, value

    def _has_grad_inputs(self):
        """Whether :meth:`gradient_inputs` is available (inducing points can move)."""
        return type(self)._grad_inputs is not Kernel._grad_inputs

    def _n_free(self):
        """The length of θ, from the attributes as they are (no validation)."""
        if type(self).theta is not Kernel.theta:
            return self.n_dims
        n = 0
        for h in self._hyper:
            if not isinstance(getattr(self, h + "_bounds"), str):
                value = getattr(self, h)
                n += (value.size if type(value) is np.ndarray else 1 if type(value) is float
                      else int(np.size(value)))
        return n

    def _with_theta(self, theta):
        """``clone_with_theta(theta)`` for a θ that comes from this kernel's own (moved by an
        optimiser step and clipped to its bounds): shallow copies without the parameter checks of
        a full clone, which a θ step after every minibatch would pay each time."""
        if type(self).theta is not Kernel.theta or type(self).clone_with_theta is not Kernel.clone_with_theta:
            return self.clone_with_theta(theta)
        new = _shallow_copy(self)
        values = np.exp(np.asarray(theta, dtype=np.float64))
        i, parts = 0, {}
        for h in self._hyper:
            if isinstance(getattr(self, h + "_bounds"), str):       # "fixed"
                continue
            value = getattr(self, h)
            if type(value) is float:
                size, ndim = 1, 0
            elif type(value) is np.ndarray:
                size, ndim = value.size, value.ndim
            else:
                size, ndim = int(np.size(value)), np.ndim(value)
            part = values[i:i + size]
            i += size
            setattr(new, h, float(part[0]) if ndim == 0 else part.copy())
            parts[h] = part
        new.__dict__.pop("_hyper_cache", None)
        if values.size and all(0.0 < v < math.inf for v in values.tolist()):
            # the same bounds, and values that pass the checks: the entries without them (each
            # free one the slice of exp θ it was set from, which only these entries see)
            old = self._hyper_entries()
            cached = self.__dict__.get("_hyper_cache")
            state = (_moved_key(*cached[0], self._hyper, new, parts)
                     if cached is not None and cached[1] is old else new._hyper_key())
            if state is not None:
                entries = [(h, _read_only(parts[h]) if b is not None else vals, b)
                           for h, vals, b in old]
                new.__dict__["_hyper_cache"] = (state, entries)
        return new

    # -- algebra, comparison, display --------------------------------------------------------

    def __add__(self, other):
        from .operators import Sum
        from .simple import ConstantKernel
        return Sum(self, other if _is_kernel_like(other) else ConstantKernel(other))

    def __radd__(self, other):
        from .operators import Sum
        from .simple import ConstantKernel
        return Sum(other if _is_kernel_like(other) else ConstantKernel(other), self)

    def __mul__(self, other):
        from .operators import Product
        from .simple import ConstantKernel
        return Product(self, other if _is_kernel_like(other) else ConstantKernel(other))

    def __rmul__(self, other):
        from .operators import Product
        from .simple import ConstantKernel
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


def _moved_key(key, objects, hyper, new, moved):
    """:meth:`Kernel._hyper_key` of ``new``, a shallow copy whose hyperparameters named in
    ``moved`` were set anew, from its original's valid key (``key``, ``objects``): the other
    attributes and every bounds are the original's own objects, whose snapshots it holds."""
    key, objects = list(key), list(objects)
    for j, h in enumerate(hyper):
        if h in moved:
            value = getattr(new, h)
            key[2 * j], objects[2 * j] = _snapshot(value), value
    return tuple(key), tuple(objects)


class BoundKernel:
    """A kernel bound to inducing inputs Z (m x d): the blocks and gradients a sparse model's
    step asks for, each call on one chunk of rows.

    This generic form forwards to the kernel's own methods (``_cross``, ``_diag``,
    ``_cross_gradient``, ``_gram_gradient``), whose Python holds the GIL, except that for k +
    white noise where k has a compiled bound (:meth:`Kernel._noise_split`) it takes k's blocks
    and their contractions from that bound, bound once, and adds the noise on the diagonal: the
    same operations in the same order as the kernel's methods, without their dispatch; kernels
    with a compiled
    path (:class:`gpc.kernels.RBF`, alone or times a constant) return their own subclass from
    :meth:`Kernel._bound_to`, which prepares what depends on Z and θ once and runs each chunk in
    one call without the GIL (``nogil``).

    Attributes
    ----------
    kernel : Kernel
    Z : ndarray of shape (m, d)
    nogil : bool
        Whether a chunk's calls release the GIL and cost little Python, so that fine chunks on
        the block threads pay; ``row_work`` then estimates a row's cost in multiply-adds.
    """

    nogil = False
    row_work = 0

    def __init__(self, kernel, Z):
        self.kernel = kernel
        self.Z = Z
        split = kernel._noise_split(Z)
        self._inner = None if split is None else split[0]
        if split is not None:
            noise, self._split_term = split[1], split[3]
            self._noise, self._noise_first = float(noise.noise_level), split[2]
            self._noise_free = noise._free()

    def gram(self):
        """K_uu = K(Z) (m x m, C-ordered), with its diagonal exact (``k(z, z)``, not the
        rounding of the cross block's zero distances) where K(Z) is the cross block K(Z, Z)
        (:meth:`Kernel._gram_is_cross`)."""
        kernel, Z = self.kernel, self.Z
        if kernel._gram_is_cross():
            K = kernel._cross(Z, Z)
            np.fill_diagonal(K, kernel._diag(Z))
            return K
        if self._inner is not None:
            # k's own K(Z) (Z is checked), the noise added on the diagonal: what the sum's
            # K(Z) + σ₀² I gives (its zeros off the diagonal add nothing)
            K = self._inner.call_gram()
            K.flat[:: K.shape[0] + 1] += self._noise
            return K
        return np.array(kernel(Z), dtype=np.float64, order="C")

    def call_gram(self):
        """K(Z) in the rounding of the kernel's own K(Z) (``_call(Z, None, False)``, which may
        differ from :meth:`gram`'s in the last bits), as a new C-ordered array."""
        return np.array(self.kernel._call(self.Z, None, False), dtype=np.float64, order="C")

    def cross(self, X, out=None):
        """K(X, Z) (k x m) for a chunk of rows X (k x d), written into ``out`` when given."""
        if self._inner is not None:         # white noise is zero between distinct draws
            return self._inner.cross(X, out)
        K = self.kernel._cross(X, self.Z)
        if out is None:
            return K
        out[...] = K
        return out

    def diag(self, X):
        """diag K(X, X), shape (k,)."""
        if self._inner is not None:
            return self._inner.diag(X) + np.full(X.shape[0], self._noise)
        return self.kernel._diag(X)

    def cross_gradient(self, X, G, w=None, K=None):
        """(∂F/∂θ, ∂F/∂Z or None) of F = Σ G ∘ K(X, Z) + Σ w ∘ diag K(X, X) for a chunk of rows
        (:meth:`Kernel.cross_gradient`); G (k x m, C-ordered float64) is scratch, ``K`` is
        K(X, Z) when the caller holds it."""
        if self._inner is not None:
            # k's compiled contraction, and the noise's ∂/∂log σ₀² = σ₀² Σ w (diagonal only)
            g_inner, g_Z, _ = self._inner.gradient(X, np.ascontiguousarray(G, dtype=np.float64),
                                                   w, K)
            return self._with_noise(g_inner, self._noise * (0.0 if w is None
                                                            else float(np.sum(w)))), g_Z
        g_theta, g_Z, _ = self.kernel._cross_gradient(X, self.Z, G, w, K, overwrite=True)
        return g_theta, g_Z

    def gram_gradient(self, G, K):
        """(∂F/∂θ, ∂F/∂Z or None) of F = Σ G ∘ K(Z) for a symmetric G (m x m, C-ordered float64,
        scratch) and ``K`` = :meth:`gram`'s K_uu."""
        if self._inner is not None:
            # k's compiled contraction of its own K(Z) (K less the noise on its diagonal) gives
            # θ and Z in one pass (Z: twice the second argument's part, G being symmetric), and
            # the noise's ∂/∂log σ₀² = σ₀² tr G
            g_noise = self._noise * float(np.trace(G))
            K_inner = np.array(K, dtype=np.float64, order="C")
            K_inner.flat[:: K_inner.shape[0] + 1] -= self._noise
            g_inner, g_Z, _ = self._inner.gradient(self.Z, G, None, K_inner)
            g_Z *= 2.0
            return self._with_noise(g_inner, g_noise), g_Z
        return self.kernel._gram_gradient(self.Z, G, K)

    def _with_noise(self, g_inner, g_noise):
        """k's θ gradient and the noise's, in the sum's order of θ."""
        noise = np.array([g_noise]) if self._noise_free else np.empty(0)
        return np.concatenate([noise, g_inner] if self._noise_first else [g_inner, noise])


def _fmt(v):
    if isinstance(v, np.ndarray):
        return "[" + ", ".join(f"{x:.3g}" for x in v.ravel()) + "]"
    if isinstance(v, float):
        return f"{v:.3g}"
    return repr(v)


def _is_kernel_like(obj):
    return isinstance(obj, Kernel) or all(
        hasattr(obj, a) for a in ("theta", "bounds", "diag", "clone_with_theta"))

