"""Large arrays that are filled a block at a time, in small pages.

NumPy asks the kernel for transparent huge pages on every array of 4 MiB or more
(``madvise(MADV_HUGEPAGE)``).  For an array written once, a slice per step, that is a gamble:
where the kernel has free 2 MiB pages a first write is cheap, and where memory is fragmented it
compacts memory in the writing thread first (Linux's default ``defrag=madvise``), which can cost
several times a step's own writes.  Base-size (4 KiB) pages cost the same on every write.  The
sparse engine's site directions (n x m, SEP §2.3) are such an array, written once per epoch;
:func:`zeros` gives them the predictable pages.
"""

import mmap

import numpy as np

#: below this many bytes NumPy does not advise huge pages either
SMALL = 4 << 20


def zeros(shape, dtype):
    """``np.zeros(shape, dtype)`` in pages of the system's base size (no huge-page advice):
    anonymous private memory from ``mmap`` where the platform has it (POSIX), NumPy's own
    allocation otherwise and for arrays under 4 MiB.  The array owns its memory (it is freed
    with the array) and copies, pickles and slices as any other."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    flags = getattr(mmap, "MAP_PRIVATE", None), getattr(mmap, "MAP_ANONYMOUS", None)
    if size < SMALL or None in flags:
        return np.zeros(shape, dtype)
    buffer = mmap.mmap(-1, size, flags=flags[0] | flags[1])
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)
