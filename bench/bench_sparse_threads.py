"""The sparse engine on every core (issue 28): one epoch of minibatch SEP with 1 and k threads.

In one process, alternating the settings round by round, one epoch of
``SparseGaussianProcessClassifier`` (minibatch SEP, per-row sites, m = 200, the problem of
bench/bench_sparse.py: d = 8, ConstantKernel · ARD RBF from the k-means Z and the median length
scale) at each batch size with ``n_jobs`` = each thread count; reports the median time per
setting, its ratio to one thread, the test NLL, and whether the predictions of every thread count
are the same bits (the largest difference to one thread's otherwise).

Parts, each optional and bounded:

* the default: n = 200,000, batches 200, 2000, 20000, threads 1 and 2 (targets on 2 cores: ≤ 0.6
  of one thread's time at 2000 and 20000, ≤ 0.85 at 200);
* ``--burner``: the same with a busy-loop subprocess holding one core (target: k threads take at
  most 1.2× one thread's time);
* ``--peer``: n = 1,000,000, batch 2000, one thread and all cores, against GPyTorch's SVGP at the
  same batch on all cores (``--peer-device cuda --peer-dtype float32`` on a GPU; GPyTorch is a
  bench-only peer, never a dependency of gpc): time ratio and NLL of both (target: ≤ 0.5× GPyTorch's
  CPU time at equal or better NLL);
* ``--device``: the preset for a 16-core GPU machine, one round of each, about five minutes: the
  scaling at n = 200,000 with 1, 2, 4, 8 threads and every core, then ``--peer`` with one thread
  and every core against GPyTorch on CUDA in float32 when ``torch.cuda.is_available()`` and on the
  CPU (every core, while less than seven minutes have gone).

``--max-seconds`` ends the alternating rounds once that much time has gone (a round is never cut
short); every part prints a compact table.

Examples::

    python bench/bench_sparse_threads.py                         # 2 cores: n = 200,000
    python bench/bench_sparse_threads.py --burner --batches 2000
    python bench/bench_sparse_threads.py --peer                  # n = 10^6 against GPyTorch (CPU)
    python bench/bench_sparse_threads.py --device                # 16 cores + GPU, ~5 minutes
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402

from bench_sparse import _nll, gpytorch_fit, peer_problem, sep_fit  # noqa: E402


def cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class Burner:
    """A subprocess that busy-loops on one core while the ``with`` block runs."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def epochs_alternating(Xtr, ytr, Xte, yte, Z0, ell, batches, threads, repeats, max_seconds,
                       label=""):
    """One epoch per (batch, threads), the settings alternating round by round; returns
    {(batch, threads): [(seconds, test NLL, test probabilities)]}."""
    out = {}
    start = time.perf_counter()
    for r in range(repeats):
        for b in batches:
            for t in threads:
                clf, wall, _ = sep_fit(Xtr, ytr, Z0, ell, b, n_jobs=t)
                p = clf.predict_proba(Xte)[:, 1]
                out.setdefault((b, t), []).append((wall, _nll(p, yte), p))
        line = ", ".join(f"b={b} t={t}: {v[-1][0]:.2f} s" for (b, t), v in out.items())
        print(f"{label}round {r + 1}: {line}; load {os.getloadavg()[0]:.1f}", flush=True)
        if time.perf_counter() - start > max_seconds and r + 1 < repeats:
            print(f"{label}stopping after {r + 1} rounds (--max-seconds {max_seconds:g})")
            break
    return out


def table(out, threads, targets=None, title=""):
    """The compact table of :func:`epochs_alternating`'s results."""
    print(f"\n{title}")
    print(f"| batch | threads | epoch (median) | ÷ 1 thread (median of rounds) | target | test NLL "
          f"| predictions vs 1 thread |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for b in sorted({b for b, _ in out}):
        base = out[(b, threads[0])]
        for t in threads:
            runs = out[(b, t)]
            secs = np.array([r[0] for r in runs])
            n = min(len(runs), len(base))
            ratio = np.median(secs[:n] / np.array([r[0] for r in base[:n]]))
            diff = max(float(np.max(np.abs(r[2] - q[2]))) for r, q in zip(runs, base))
            same = all(np.array_equal(r[2], q[2]) for r, q in zip(runs, base))
            target = "" if targets is None or t == threads[0] else targets(b, t)
            print(f"| {b} | {t} | {np.median(secs):.2f} s | {ratio:.2f} | {target} | "
                  f"{runs[0][1]:.4f} | {'same bits' if same else f'max diff {diff:.1e}'} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000, help="training rows (default 200,000)")
    ap.add_argument("--test", type=int, default=10_000, help="held-out rows")
    ap.add_argument("--batches", type=int, nargs="+", default=[200, 2000, 20000])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                    help="thread counts (the first is the baseline); 0 means every core")
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds")
    ap.add_argument("--burner", action="store_true", help="one core busy with a busy loop")
    ap.add_argument("--no-plain", action="store_true", help="skip the part without a burner")
    ap.add_argument("--peer", action="store_true",
                    help="n = 10^6, batch 2000: gpc 1 thread and all cores against GPyTorch")
    ap.add_argument("--peer-n", type=int, default=1_000_000)
    ap.add_argument("--peer-device", default="cpu", help="cpu or cuda")
    ap.add_argument("--peer-dtype", default="float64", help="float64 or float32")
    ap.add_argument("--device", action="store_true",
                    help="preset for a 16-core GPU machine: the scaling at --n, then the --peer "
                         "part with GPyTorch on CUDA float32 when available and on the CPU")
    ap.add_argument("--max-seconds", type=float, default=1800.0,
                    help="no new round after this many seconds of a part")
    args = ap.parse_args(argv)
    threads = [cores() if t == 0 else t for t in args.threads]
    print(f"cores {cores()}, load average {os.getloadavg()[0]:.1f}, python {sys.version.split()[0]}",
          flush=True)
    if args.device:
        return device(args)
    if args.peer:
        return peer(args, [1, cores()], [(args.peer_device, args.peer_dtype)], args.repeats)
    Xtr, ytr, Xte, yte, Z0, ell = peer_problem(args.n, args.test)

    def targets(b, t):
        return "≤ 0.85" if b <= 200 else "≤ 0.6"

    if not args.no_plain:
        out = epochs_alternating(Xtr, ytr, Xte, yte, Z0, ell, args.batches, threads, args.repeats,
                                 args.max_seconds)
        rounds = len(out[(args.batches[0], threads[0])])
        table(out, threads, targets, f"n = {args.n}, m = 200, one epoch each, {rounds} rounds")
    if args.burner:
        with Burner():
            out = epochs_alternating(Xtr, ytr, Xte, yte, Z0, ell, args.batches, threads,
                                     args.repeats, args.max_seconds, "[burner] ")
        table(out, threads, lambda b, t: "≤ 1.2",
              f"with a busy-loop process on one core: n = {args.n}, m = 200")
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")


def peer(args, threads, devices, repeats, deadline=None):
    """gpc with ``threads`` and GPyTorch on each of ``devices`` [(device, dtype)] (all cores on
    the CPU) at batch 2000, n = ``--peer-n``, one epoch; GPyTorch runs only while the wall-clock
    ``deadline`` (time.perf_counter) is not past."""
    Xtr, ytr, Xte, yte, Z0, ell = peer_problem(args.peer_n, args.test)
    b = 2000
    out = epochs_alternating(Xtr, ytr, Xte, yte, Z0, ell, [b], threads, repeats, args.max_seconds)
    table(out, threads, None, f"gpc: n = {args.peer_n}, m = 200, batch {b}, one epoch")
    try:
        import torch  # noqa: F401
        import gpytorch  # noqa: F401
    except ImportError:
        print("GPyTorch is not installed: no peer (pip install torch gpytorch)")
        return
    peers = {}
    for device_name, dtype in devices:
        runs = []
        for _ in range(repeats):
            if deadline is not None and time.perf_counter() > deadline:
                print(f"no time left for GPyTorch on {device_name}")
                break
            p, wall, _ = gpytorch_fit(Xtr, ytr, Xte, Z0, ell, b, threads=cores(),
                                      device=device_name, dtype=dtype)
            runs.append((wall, _nll(p, yte)))
            print(f"gpytorch ({device_name}, {dtype}): {wall:.2f} s, NLL {runs[-1][1]:.4f}",
                  flush=True)
        if runs:
            peers[(device_name, dtype)] = runs
    print("\n| what | epoch (median) | test NLL | " +
          " | ".join(f"gpc ÷ GPyTorch {d} {t}" for d, t in peers) + " |")
    print("| --- | --- | --- |" + " --- |" * len(peers))
    walls = {key: float(np.median([r[0] for r in runs])) for key, runs in peers.items()}
    for t in threads:
        runs = out[(b, t)]
        secs = float(np.median([r[0] for r in runs]))
        print(f"| gpc, {t} thread{'s' if t > 1 else ''} | {secs:.2f} s | {runs[0][1]:.4f} | " +
              " | ".join(f"{secs / w:.2f}" for w in walls.values()) + " |")
    for (d, t), runs in peers.items():
        where = f", {cores()} threads" if d == "cpu" else ""
        print(f"| GPyTorch SVGP, {d} {t}{where} | {walls[(d, t)]:.2f} s | {runs[0][1]:.4f} | " +
              " | ".join("" for _ in peers) + " |")


def device(args):
    """The 16-core GPU machine's run, one round of each part, about five minutes: the thread
    scaling at n = 200,000 (batches 200, 2000, 20000; 1, 2, 4, 8 and every core), then n = 10^6 at
    batch 2000 with one thread and every core against GPyTorch on CUDA in float32 (when
    ``torch.cuda.is_available()``) and on the CPU (all cores), the CPU peer only while less than
    seven minutes have gone."""
    start = time.perf_counter()
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    n_cores = cores()
    threads = sorted({t for t in (1, 2, 4, 8, n_cores) if t <= n_cores})
    Xtr, ytr, Xte, yte, Z0, ell = peer_problem(args.n, args.test)
    out = epochs_alternating(Xtr, ytr, Xte, yte, Z0, ell, args.batches, threads, 1, 0.0)
    table(out, threads, None, f"n = {args.n}, m = 200, one epoch each, {n_cores} cores")
    devices = ([("cuda", "float32")] if cuda else []) + [("cpu", "float64")]
    peer(args, [1, n_cores], devices, 1, deadline=start + 420.0)
    print(f"\ndevice run: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
