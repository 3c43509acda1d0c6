# Tiled helpers for C-ordered square matrices, cimported by gpc._dense and gpc._kernels
# (`from gpc._tiles cimport range_stop, mirror_lower_rows`): `cdef inline` functions with no module
# state, so there is no gpc._tiles module to import at run time.

cdef inline Py_ssize_t range_stop(Py_ssize_t start, Py_ssize_t stop, Py_ssize_t n) except -1:
    """``stop`` of a row range [start, stop) of n rows (stop < 0: n), checked."""
    if stop < 0:
        stop = n
    if start < 0 or start > stop or stop > n:
        raise ValueError(f"row range [{start}, {stop}) is not within [0, {n}]")
    return stop


cdef inline void mirror_lower_rows(double[:, ::1] A, Py_ssize_t start, Py_ssize_t stop,
                                   double factor=1.0) noexcept nogil:
    """A[i, j] := factor * A[i, j] and A[j, i] := A[i, j] for j < i, start <= i < stop, in 64 x 64
    tiles: the strict lower triangle's rows start..stop-1 scaled (factor 1 leaves them exactly as
    they are) and mirrored into the strict upper triangle's columns start..stop-1, which no other
    row range writes or reads."""
    cdef Py_ssize_t tile = 64, i0 = start, j0, i, j, i1, j1
    cdef double v
    while i0 < stop:
        i1 = min(i0 + tile, stop)
        j0 = 0
        while j0 < i1 - 1:
            j1 = j0 + tile
            for i in range(i0, i1):
                for j in range(j0, min(j1, i)):
                    v = factor * A[i, j]
                    A[i, j] = v
                    A[j, i] = v
            j0 += tile
        i0 += tile


cdef inline void mirror_lower(double[:, ::1] A) noexcept nogil:
    """A[j, i] = A[i, j] for i > j, in 64 x 64 tiles (cache friendly)."""
    mirror_lower_rows(A, 0, A.shape[0])
