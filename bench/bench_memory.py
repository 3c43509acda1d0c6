"""Peak memory of one exact fit, in units of one n x n float64 buffer (issue 16).

The public path: ``GaussianProcessClassifier(kernel, method=..., optimizer=None).fit(X, y)`` with a
scikit-learn-style kernel of gpc's own (2.0 * RBF(3.0)), the bench's n x 10 data (bench_dropin.data).
Peak = tracemalloc's peak over the fit (NumPy's buffers are traced) minus what was allocated
before it; divided by 8 n^2 bytes.  Wall time is reported alongside (one run, cold).

Run: ``python bench/bench_memory.py [n ...] [--methods laplace ep]`` (default n = 2000 4000).
BLAS threads follow ``GPC_BENCH_THREADS`` (default 1).
"""

import argparse
import os
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(__file__))

from threadpoolctl import threadpool_limits  # noqa: E402

from bench_dropin import data  # noqa: E402
from gpc import GaussianProcessClassifier  # noqa: E402
from gpc.kernels import RBF, ConstantKernel  # noqa: E402


def peak_buffers(n, method, schedule=None):
    X, y = data(n)
    est = GaussianProcessClassifier(kernel=ConstantKernel(2.0) * RBF(3.0), method=method,
                                    schedule=schedule, optimizer=None)
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    t0 = time.perf_counter()
    est.fit(X, y)
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return (peak - base) / (8.0 * n * n), seconds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", nargs="*", type=int, default=[2000, 4000])
    ap.add_argument("--methods", nargs="+", default=["laplace", "ep", "ep:parallel"])
    args = ap.parse_args(argv)
    threads = int(os.environ.get("GPC_BENCH_THREADS", "1"))
    print(f"BLAS threads = {threads}")
    with threadpool_limits(threads):
        for n in args.sizes:
            for label in args.methods:
                method, _, schedule = label.partition(":")
                buffers, seconds = peak_buffers(n, method, schedule or None)
                print(f"n = {n:6d}  {label:<12} peak {buffers:5.2f} n x n buffers  "
                      f"({buffers * 8 * n * n / 2**30:.2f} GiB)  fit {seconds:8.1f} s", flush=True)


if __name__ == "__main__":
    main()
