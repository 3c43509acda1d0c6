"""Prediction speed: ``predict_proba`` on 10⁶ rows, gpc's sparse classifier against GPyTorch's SVGP.

    python bench/bench_predict.py [--n-predict N] [--m M] [--threads T] [--rounds R]

Both models are trained for one epoch on bench_sparse.py's problem (n = 200,000, d = 8, minibatch
2000; gpc's minibatch SEP with its defaults, GPyTorch's SVGP with natural gradients as in
bench_time_to_accuracy.py), from the same k-means Z0 and length scale.  Then each predicts the
class probabilities of ``--n-predict`` new rows, alternated ``--rounds`` times, on ``--threads``
threads (all cores by default):

* gpc: ``clf.predict_proba(X)``, the public call (its own row blocks and threads);
* GPyTorch: ``likelihood(model(X_chunk)).mean`` under ``torch.no_grad()`` and
  ``gpytorch.settings.fast_pred_var()`` in eval mode, over chunks of ``--chunk`` rows (a user
  must chunk: one 10⁶ x m float64 cross-covariance is 1.6 GB at m = 200), float64, on the CPU.

Printed: seconds per call (median over the rounds), the ratio gpc ÷ GPyTorch, and the mean and
largest difference between the two models' probabilities (they are different fits, so this is a sanity
check that both predict the same problem, not a tolerance).  GPyTorch and torch are bench-only
peers, never gpc's dependencies.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_sparse import machine_table, make_data  # noqa: E402
from bench_time_to_accuracy import run_gpc, run_gpytorch, start_point  # noqa: E402


def gpytorch_predict(model, lik, X, chunk, threads):
    import gpytorch
    import torch

    torch.set_num_threads(threads)
    model.eval()
    lik.eval()
    Xt = torch.from_numpy(X)
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        return np.concatenate([lik(model(Xt[a:a + chunk])).mean.numpy()
                               for a in range(0, len(X), chunk)])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--n-predict", type=int, default=1_000_000)
    parser.add_argument("--m", type=int, default=200)
    parser.add_argument("--batch", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=10_000)
    args = parser.parse_args(argv)

    X, y = make_data(args.n + args.n_predict, seed=2)
    prob = (X[:args.n], y[:args.n], X[args.n:args.n + 1000], y[args.n:args.n + 1000])
    Xnew = np.ascontiguousarray(X[args.n:])
    Z0, ell = start_point(prob[0], args.m)
    machine_table(f"predict_proba: {args.n_predict} rows, m = {args.m}, {args.threads} threads")
    fit = argparse.Namespace(batch=args.batch, epochs=1, threads=args.threads)
    _, clf = run_gpc(prob, Z0, ell, fit)
    clf.set_params(n_jobs=args.threads)
    _, model, lik = run_gpytorch(prob, Z0, ell, fit, "ngd")

    times = {"gpc": [], "gpytorch": []}
    out = {}
    calls = {"gpc": lambda: clf.predict_proba(Xnew)[:, 1],
             "gpytorch": lambda: gpytorch_predict(model, lik, Xnew, args.chunk, args.threads)}
    for r in range(args.rounds):
        for name in (("gpc", "gpytorch") if r % 2 == 0 else ("gpytorch", "gpc")):
            t = time.perf_counter()
            out[name] = calls[name]()
            times[name].append(time.perf_counter() - t)
            print(f"round {r + 1} {name}: {times[name][-1]:.2f} s", flush=True)
    g, p = (float(np.median(times[k])) for k in ("gpc", "gpytorch"))
    diff = np.abs(out["gpc"] - out["gpytorch"])
    print("| rows | threads | gpc s | GPyTorch s | gpc ÷ GPyTorch | mean, max |p_gpc - p_GPyTorch| |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| {args.n_predict:,} | {args.threads} | {g:.2f} | {p:.2f} | {g / p:.3f} | "
          f"{np.mean(diff):.3f}, {np.max(diff):.3f} |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
