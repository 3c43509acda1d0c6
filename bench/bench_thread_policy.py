"""Every estimator with its default threads against one thread, and two fits in threads.

    python bench/bench_thread_policy.py [--rounds 3] [--burner] [--cases NAME ...]

The path users take: each estimator with its defaults (``n_jobs=None``, BLAS as the process has
it) against the same fit with ``n_jobs=1`` inside ``threadpool_limits(1)``, alternating, for
``--rounds`` rounds; wall seconds of ``fit`` (cold: a new estimator each time), the ratio of the
minima and of the medians (default / one thread; the goal of the thread policy, gpc._threads, is
≤ 1.1 quiet and ≤ 1.2 with ``--burner``, a busy loop in another process on one core), and whether
both settings predict the same bits.  ``concurrent`` fits two small sparse models in two threads
(joblib's threading backend) against the same two one after the other.

Cases: MultiClassGPC with each model on glass and wine (70 % splits, standardised), the dense
classifier's EP at n = 1000 (banana), SparseGaussianProcessClassifier on banana (5,300 rows) and
SparseMultiClassGPC on glass, all with their defaults.
"""

import argparse
import multiprocessing
import os
import platform
import time
import warnings

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

import gpc
from gpc import datasets


def burn():
    while True:
        pass


def _split(d, frac=0.7, seed=0):
    X, y = np.asarray(d.X, dtype=float), np.asarray(d.y)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(frac * len(y))
    tr, te = order[:cut], order[cut:]
    mu, sd = X[tr].mean(axis=0), X[tr].std(axis=0)
    sd[sd == 0] = 1.0
    return (X[tr] - mu) / sd, y[tr], (X[te] - mu) / sd, y[te]


def _cases():
    glass = _split(datasets.load_glass())
    wine = _split(datasets.load_wine(binary=False))
    banana = _split(datasets.load_banana())
    b1000 = (banana[0][:1000], banana[1][:1000], banana[2], banana[3])
    cases = {}
    for model, short in (("robust", "rmgpc"), ("standard", "smgpc"), ("heavy-tailed", "htpc")):
        for name, data in (("glass", glass), ("wine", wine)):
            cases[f"{short}-{name}"] = (lambda n_jobs, model=model: gpc.MultiClassGPC(
                model=model, n_jobs=n_jobs, random_state=0), data)
    cases["gpc-ep-1000"] = (lambda n_jobs: gpc.GaussianProcessClassifier(
        method="ep", n_jobs=n_jobs, random_state=0), b1000)
    cases["sparse-banana"] = (lambda n_jobs: gpc.SparseGaussianProcessClassifier(
        n_jobs=n_jobs, random_state=0, progress=False), banana)
    cases["sparse-multiclass-glass"] = (lambda n_jobs: gpc.SparseMultiClassGPC(
        n_jobs=n_jobs, random_state=0, progress=False), glass)
    return cases


def _fit(make, data, one_thread):
    Xtr, ytr, Xte, _ = data
    model = make(1 if one_thread else None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if one_thread:
            with threadpool_limits(1):
                t0 = time.perf_counter()
                model.fit(Xtr, ytr)
                seconds = time.perf_counter() - t0
        else:
            t0 = time.perf_counter()
            model.fit(Xtr, ytr)
            seconds = time.perf_counter() - t0
    return seconds, model.predict_proba(Xte)


def _concurrent(rounds):
    from joblib import Parallel, delayed
    d = datasets.load_banana()
    X, y = np.asarray(d.X, dtype=float)[:300], np.asarray(d.y)[:300]

    def fit():
        return gpc.SparseGaussianProcessClassifier(random_state=0, progress=False).fit(X, y)

    serial, threads = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        a = [fit().predict_proba(X) for _ in range(2)]
        serial.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        b = Parallel(n_jobs=2, backend="threading")(delayed(fit)() for _ in range(2))
        threads.append(time.perf_counter() - t0)
        same = all(np.array_equal(p, m.predict_proba(X)) for p, m in zip(a, b))
    return min(serial), min(threads), same


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burner", action="store_true")
    parser.add_argument("--cases", nargs="*", default=None)
    args = parser.parse_args()
    burner = None
    if args.burner:
        burner = multiprocessing.Process(target=burn, daemon=True)
        burner.start()
    try:
        cases = _cases()
        names = args.cases or list(cases) + ["concurrent"]
        print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
              f"{os.getloadavg()[0]:.1f}{', a busy loop on one core' if burner else ''}; BLAS: "
              + ", ".join(f"{i['internal_api']} {i['version']} ({i['num_threads']} threads)"
                          for i in threadpool_info() if i["user_api"] == "blas"))
        print(f"{'case':26s} {'default s (min/med)':>20s} {'1 thread s (min/med)':>21s} "
              f"{'ratio min':>9s} {'ratio med':>9s}  same bits")
        for name in names:
            if name == "concurrent":
                s, t, same = _concurrent(args.rounds)
                print(f"{'2 sparse fits, threads':26s} {t:20.3f} {s:21.3f} {t / s:9.3f} "
                      f"{'':9s}  {same}   (threads / one after the other)", flush=True)
                continue
            make, data = cases[name]
            times = {False: [], True: []}
            probs = {}
            for _ in range(args.rounds):
                for one in (False, True):
                    seconds, p = _fit(make, data, one)
                    times[one].append(seconds)
                    probs[one] = p
            d, o = np.array(times[False]), np.array(times[True])
            print(f"{name:26s} {d.min():9.3f}/{np.median(d):9.3f}  {o.min():9.3f}/{np.median(o):9.3f} "
                  f"{d.min() / o.min():9.3f} {np.median(d) / np.median(o):9.3f}  "
                  f"{np.array_equal(probs[False], probs[True])}", flush=True)
    finally:
        if burner is not None:
            burner.terminate()


if __name__ == "__main__":
    main()
