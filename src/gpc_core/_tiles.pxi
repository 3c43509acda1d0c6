# Tiled helpers for C-ordered square matrices, included by _dense and _kernels (no module state).

cdef void mirror_lower(double[:, ::1] A) noexcept nogil:
    """A[j, i] = A[i, j] for i > j, in 64 x 64 tiles (cache friendly)."""
    cdef Py_ssize_t n = A.shape[0], tile = 64, i0 = 0, j0, i, j, i1, j1
    while i0 < n:
        i1 = min(i0 + tile, n)
        j0 = 0
        while j0 <= i0:
            j1 = min(j0 + tile, n)
            for i in range(i0, i1):
                for j in range(j0, min(j1, i)):
                    A[j, i] = A[i, j]
            j0 += tile
        i0 += tile
