"""gpc._special: vectorised Python entry points to the special functions of gpc/_special.pxd.

The compiled modules cimport the ``cdef inline`` functions themselves; the Python layers (the
variational bounds, RMGPC's EP evidence) call these, so that every engine evaluates one definition.
Each takes an array of any shape (or a scalar) and returns a float64 array of that shape.
"""

import numpy as np

# gpc/_special.pxd is this module's own declaration file: its functions and constants are in scope.

# ½ log 2π for the Python layers, the value the compiled modules use (the C name is a constant of
# the .pxd, so the Python attribute is set through the module's dict)
globals()["LOG_SQRT_2PI"] = LOG_SQRT_2PI

ctypedef double (*unary_fn)(double) noexcept nogil


cdef object _apply(unary_fn fn, object x):
    arr = np.array(x, dtype=np.float64, order="C")      # a copy; 0-d stays 0-d
    out = np.empty_like(arr)
    cdef const double[::1] a = arr.reshape(-1)
    cdef double[::1] o = out.reshape(-1)
    cdef Py_ssize_t i
    with nogil:
        for i in range(a.shape[0]):
            o[i] = fn(a[i])
    return out


def inverse_mills(z):
    """r(z) = φ(z)/Φ(z), the inverse Mills ratio, elementwise (gpc/_special.pxd: ``inv_mills``).

    Parameters
    ----------
    z : array_like

    Returns
    -------
    ndarray
        r(z) = √(2/π)/erfcx(−z/√2): about −z − 1/z for z ≪ 0, 0 above z ≈ 37.5.
    """
    return _apply(inv_mills, z)


def z_plus_inverse_mills(z):
    """z + r(z) > 0 elementwise, without cancellation for z ≪ 0 (Laplace's continued fraction
    below z = −5; gpc/_special.pxd: ``z_plus_inv_mills``).

    Parameters
    ----------
    z : array_like

    Returns
    -------
    ndarray
    """
    return _apply(z_plus_inv_mills, z)


def softplus(x):
    """log(1 + eˣ) elementwise, without overflow (gpc/_special.pxd: ``log1pexp``).

    Parameters
    ----------
    x : array_like

    Returns
    -------
    ndarray
    """
    return _apply(log1pexp, x)
