"""Where a threaded minibatch step spends its time, pass by pass, on the machine at hand.

A minibatch step of the sparse engine is a handful of passes over fixed blocks of rows
(``gpc._parallel.over_blocks``) and serial m × m work between them.  Three parts, each a few
seconds:

``--part dispatch``: the cost of a pass itself on 1, 2, 4, 8, 16 threads: 4 or 16 blocks that do
nothing, and 16 blocks that each sleep 200 µs (the GIL released, as the engine's blocks do).

``--part ceiling``: 16 and 64 blocks of a triangular multiply (dtrmm, 125 or 1250 rows × 200,
gpc._lapack) on 1 to 16 threads: the speed-up the BLAS blocks alone allow here.

``--part timeline`` (default): one epoch at n = 40,000 (``--n``), b = 2000 (``--batch``),
m = 200 (bench_sparse's problem) on 1 thread and on every core; for the last 10 steps, per pass: its wall time, the sum
of its blocks' durations, when its last block started, and how many threads ran its blocks.

    python bench/sparse_passes.py --part timeline
"""

import argparse
import collections
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402

from gpc import _lapack, _parallel  # noqa: E402


def cores():
    return len(os.sched_getaffinity(0))


def thread_counts():
    return sorted({t for t in (1, 2, 4, 8, 16, cores()) if t <= max(16, cores())})


def part_dispatch():
    for t in thread_counts():
        with _parallel.block_threads(t):
            for blocks in (4, 16):
                _parallel.over_blocks(lambda j: None, blocks)
                k = 2000
                start = time.perf_counter()
                for _ in range(k):
                    _parallel.over_blocks(lambda j: None, blocks)
                print(f"empty pass, {t:2d} threads, {blocks:2d} blocks: "
                      f"{1e6 * (time.perf_counter() - start) / k:7.1f} µs", flush=True)
            k = 200
            start = time.perf_counter()
            for _ in range(k):
                _parallel.over_blocks(lambda j: time.sleep(0.0002), 16)
            print(f"16 blocks of 200 µs asleep, {t:2d} threads: "
                  f"{1e6 * (time.perf_counter() - start) / k:7.0f} µs (work ÷ threads: "
                  f"{16 * 200 / t:.0f} µs)", flush=True)


def part_ceiling():
    m = 200
    rng = np.random.default_rng(0)
    L = np.tril(rng.standard_normal((m, m))) + 10 * np.eye(m)
    for rows, blocks in ((125, 16), (125, 64), (1250, 16)):
        A = rng.standard_normal((rows * blocks, m))

        def block(j):
            _lapack.multiply_triangular_rows(L, A[j * rows:(j + 1) * rows], True)
        base = None
        for t in thread_counts():
            with _parallel.block_threads(t):
                _parallel.over_blocks(block, blocks)
                k = max(3, 2000 // blocks)
                start = time.perf_counter()
                for _ in range(k):
                    _parallel.over_blocks(block, blocks)
                wall = (time.perf_counter() - start) / k
            base = base or wall
            print(f"{blocks} blocks of {rows} x {m} rows (dtrmm), {t:2d} threads: "
                  f"{1e3 * wall:7.3f} ms, speed-up {base / wall:5.2f}", flush=True)


def part_timeline(n, batch):
    from bench_sparse import peer_problem, sep_fit
    log = []
    original = _parallel.over_blocks

    def spy(fn, n_blocks):
        if threading.current_thread() is not threading.main_thread():
            return original(fn, n_blocks)
        name = sys._getframe(1).f_code.co_name
        start = time.perf_counter()
        blocks = []

        def timed(j):
            begun = time.perf_counter()
            out = fn(j)
            blocks.append((threading.get_ident(), begun - start, time.perf_counter() - start))
            return out
        out = original(timed, n_blocks)
        log.append((f"{name}[{n_blocks}]", time.perf_counter() - start, blocks))
        return out

    _parallel.over_blocks = spy
    Xtr, ytr, _, _, Z0, ell = peer_problem(n, 2000)
    for t in sorted({1, cores()}):
        log.clear()
        _, wall, _ = sep_fit(Xtr, ytr, Z0, ell, batch, n_jobs=t)
        passes = collections.defaultdict(list)
        steps = min(10, n // batch)
        for name, pass_wall, blocks in log:
            passes[name].append((pass_wall, sum(e - s for _, s, e in blocks),
                                 max((s for _, s, _ in blocks), default=0.0),
                                 len({tid for tid, _, _ in blocks})))
        print(f"\n{t} thread(s): epoch {wall:.2f} s; the last {steps} steps, per pass (µs): wall, "
              f"sum of its blocks, start of its last block, threads that ran blocks")
        for name, rows in passes.items():
            mean = np.mean(rows[-steps:], axis=0)          # each pass runs once per step
            print(f"  {name:28s} {1e6 * mean[0]:7.0f} {1e6 * mean[1]:8.0f} {1e6 * mean[2]:7.0f} "
                  f"{mean[3]:5.1f}", flush=True)
    _parallel.over_blocks = original


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("dispatch", "ceiling", "timeline"), default="timeline")
    ap.add_argument("--n", type=int, default=40_000, help="training rows of the timeline")
    ap.add_argument("--batch", type=int, default=2000, help="minibatch of the timeline")
    args = ap.parse_args()
    print(f"{cores()} cores; load average {os.getloadavg()[0]:.2f}")
    if args.part == "timeline":
        part_timeline(args.n, args.batch)
    else:
        {"dispatch": part_dispatch, "ceiling": part_ceiling}[args.part]()


if __name__ == "__main__":
    main()
