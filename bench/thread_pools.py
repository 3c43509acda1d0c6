"""Why gpc's engines use one BLAS: a two-thread Cholesky right after a call into another thread pool.

NumPy and scipy each bundle their own OpenBLAS, each with its own worker threads; after a call,
a pool's idle workers keep spinning for a while before they sleep.  When the other pool's call
comes within that time, its second thread competes for the core a spinning worker holds.  This
script times scipy's dpotrf (through gpc._lapack, two BLAS threads) of an n x n matrix

- right after another dpotrf (the same pool),
- right after one NumPy matrix-vector product with two threads (the other pool),
- and the same after waiting ``--wait`` ms (busy, so the cores stay awake),

and prints the medians; bench/RESULTS.md quotes them (issue 16).  Run:
``python bench/thread_pools.py [n] [--repeats 15]`` on a machine with at least two cores.
Not collected by pytest.
"""

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

from gpc import _lapack


def busy_wait(seconds):
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pass


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--wait", type=float, nargs="+", default=[0.0, 20.0, 200.0])
    args = ap.parse_args(argv)
    n = args.n
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, n))
    A0 = X @ X.T / n + np.eye(n)
    A = np.empty_like(A0)
    v = np.ones(n)
    with threadpool_limits(2):
        for before in ("scipy dpotrf", "NumPy A @ v"):
            for wait in args.wait:
                times = []
                for _ in range(args.repeats):
                    np.copyto(A, A0)
                    if before == "scipy dpotrf":
                        _lapack.cholesky_in_place(A0.copy())
                    else:
                        A0 @ v
                    busy_wait(wait / 1e3)
                    start = time.perf_counter()
                    _lapack.cholesky_in_place(A)
                    times.append(time.perf_counter() - start)
                print(f"n = {n}, 2 threads: dpotrf {np.median(times) * 1e3:6.2f} ms "
                      f"{wait:5.0f} ms after a {before}", flush=True)


if __name__ == "__main__":
    main()
