"""HTPC (``MultiClassGPC(model="heavy-tailed")``) on wine: the default thread count against one.

    python bench/bench_htpc_threads.py [--repeats 3] [--burner]

Fits the heavy-tailed model with its defaults (type-II ML of the shared kernel) on a 70 % split
of wine (standardised on the training rows), alternately with the defaults (``n_jobs=None``: as
many threads as BLAS may use, BLAS's own thread count left as the process has it) and with one
thread (``n_jobs=1`` inside ``threadpool_limits(1)``), ``--repeats`` times each, and prints the
wall times, their medians' ratio (defaults / one thread; the goal is ≤ 1: more threads never
slower) and the test accuracy of both (equal: the thread count must not change the fit).
``--burner`` first starts a busy loop in another process, so one core is taken, as on a shared
machine.  The machine, its cores and its load are printed with the table.
"""

import argparse
import multiprocessing
import os
import time
import warnings

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from gpc import MultiClassGPC, datasets


def burn():
    while True:
        pass


def split():
    d = datasets.load_wine(binary=False)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(d.y))
    cut = int(0.7 * len(d.y))
    tr, te = order[:cut], order[cut:]
    mu, sd = d.X[tr].mean(axis=0), d.X[tr].std(axis=0)
    return (d.X[tr] - mu) / sd, d.y[tr], (d.X[te] - mu) / sd, d.y[te]


def fit(Xtr, ytr, Xte, yte, one_thread):
    model = MultiClassGPC(model="heavy-tailed", n_jobs=1 if one_thread else None)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if one_thread:
            with threadpool_limits(1):
                model.fit(Xtr, ytr)
        else:
            model.fit(Xtr, ytr)
    seconds = time.perf_counter() - t0
    return seconds, model.score(Xte, yte), model.predict_proba(Xte)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--burner", action="store_true")
    args = parser.parse_args()
    burner = None
    if args.burner:
        burner = multiprocessing.Process(target=burn, daemon=True)
        burner.start()
        time.sleep(1.0)
    try:
        Xtr, ytr, Xte, yte = split()
        times = {False: [], True: []}
        probs = {}
        acc = {}
        for _ in range(args.repeats):
            for one in (False, True):
                s, a, p = fit(Xtr, ytr, Xte, yte, one)
                times[one].append(s)
                acc[one], probs[one] = a, p
    finally:
        if burner is not None:
            burner.terminate()
    blas = ", ".join(f"{i['internal_api']} {i.get('version')} ({i['num_threads']} threads)"
                     for i in threadpool_info())
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end, BLAS {blas}"
          f"{', a busy loop on one core' if burner else ''}")
    print(f"HTPC on wine, {len(ytr)} training rows, {len(yte)} test rows, "
          f"{args.repeats} fits each, alternating\n")
    print("| threads | fits (s) | median (s) | test accuracy |")
    print("| --- | --- | --- | --- |")
    for one in (False, True):
        label = "1 (n_jobs=1, BLAS limited to 1)" if one else "default (n_jobs=None)"
        print(f"| {label} | {', '.join(f'{t:.2f}' for t in times[one])} | "
              f"{np.median(times[one]):.2f} | {acc[one]:.3f} |")
    print(f"\nratio default / 1 thread: {np.median(times[False]) / np.median(times[True]):.2f}; "
          f"max |Δp| between them: {np.max(np.abs(probs[False] - probs[True])):.1e}")


if __name__ == "__main__":
    main()
