"""The sparse engine on every core: one epoch of minibatch SEP with 1 and k threads, and its peer.

The problem is bench/bench_sparse.py's (``peer_problem``: d = 8, m = 200, ConstantKernel · ARD RBF
from the k-means Z and the median length scale, 10,000 held-out rows); each fit is one epoch of
``SparseGaussianProcessClassifier`` (minibatch SEP, per-row sites, defaults otherwise).  Every part
prints a markdown table of the machine (CPU, cores, load average, BLAS) and one of its results.
One command per part, each bounded to about five minutes on a 2-core machine:

(a) ``python bench/bench_sparse_threads.py --part plain``: n = 200,000, batches 200, 2000 and
    20000; for each batch size the thread counts alternate (1, 2, 1, 2, ...: ``--repeats`` pairs,
    default 3) in one process.  Per batch: the median epoch per thread count, the median of the
    pairs' ratios (2 threads ÷ 1; targets on 2 cores: ≤ 0.6 at 2000 and 20000, ≤ 0.85 at 200),
    the test NLL and the largest |difference| of the held-out probabilities to one thread's.
(b) ``python bench/bench_sparse_threads.py --part burner``: the same while a busy-loop process
    pinned to the last core holds it (target: 2 threads ≤ 1.2 × one thread's time).
(c) ``python bench/bench_sparse_threads.py --part peer``: n = 1,000,000, batch 2000, one epoch of
    gpc on every core against GPyTorch's SVGP on the CPU (float64, every core, the same m, batch,
    minibatch order and epochs; a bench-only peer, never a dependency of gpc), alternating, 2
    rounds: time and test NLL of both and gpc's time ÷ GPyTorch's (target: ≤ 0.5 at equal or
    better NLL).

``--quick`` shrinks each part for a smoke test (n = 40,000 for (a) and (b), 100,000 for (c); its
timings mean nothing).  ``--threads 1 4 0`` compares other thread counts (0: every core; the first
is the baseline).  ``--part device`` is the preset for a 16-core GPU machine (about five minutes):
the scaling at n = 200,000 with 1, 2, 4, 8 threads and every core, then (c) with GPyTorch on CUDA
in float32 when ``torch.cuda.is_available()`` and on the CPU.  ``--max-seconds`` (default 300)
starts no new round after that many seconds of a part, so a slow machine gets fewer pairs (said in
the output).
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402

from bench_sparse import (_nll, cores, gpytorch_fit, machine_table, peer_problem,  # noqa: E402
                          sep_fit)


class Burner:
    """A subprocess that busy-loops on one core (the last of this process's cores, pinned with
    sched_setaffinity) while the ``with`` block runs."""

    def __init__(self):
        self.core = max(os.sched_getaffinity(0))

    def __enter__(self):
        code = f"import os\nos.sched_setaffinity(0, {{{self.core}}})\nwhile True:\n    pass\n"
        self.proc = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(1.0)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def alternating(problem, batches, threads, repeats, max_seconds, label=""):
    """One epoch per (batch, threads), for each batch size the thread counts in turn, ``repeats``
    times (no new round once ``max_seconds`` have gone); returns {(batch, threads): [(seconds,
    test NLL, test probabilities)]}."""
    Xtr, ytr, Xte, yte, Z0, ell = problem
    out = {}
    start = time.perf_counter()
    for b in batches:
        for r in range(repeats):
            for t in threads:
                clf, wall, _ = sep_fit(Xtr, ytr, Z0, ell, b, n_jobs=t)
                p = clf.predict_proba(Xte)[:, 1]
                out.setdefault((b, t), []).append((wall, _nll(p, yte), p))
            line = ", ".join(f"{t} thread(s) {out[(b, t)][-1][0]:.2f} s" for t in threads)
            print(f"{label}batch {b}, round {r + 1}: {line}; load {os.getloadavg()[0]:.2f}",
                  flush=True)
            if time.perf_counter() - start > max_seconds * (batches.index(b) + 1) / len(batches) \
                    and r + 1 < repeats:
                print(f"{label}batch {b}: stopped after {r + 1} rounds (--max-seconds "
                      f"{max_seconds:g})", flush=True)
                break
    return out


def table(out, threads, target=None, title=""):
    """The results of :func:`alternating`: per batch and thread count the median epoch, the median
    of the rounds' ratios to the first thread count, the target, the test NLL and the largest
    |difference| of the held-out probabilities to the first thread count's."""
    print(f"\n### {title}\n")
    print(f"| batch | threads | rounds | epoch (median) | ÷ {threads[0]} thread(s), median of "
          f"rounds | target | test NLL | max abs diff of predictions |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for b in sorted({b for b, _ in out}):
        base = out[(b, threads[0])]
        for t in threads:
            runs = out[(b, t)]
            k = min(len(runs), len(base))
            secs = np.array([r[0] for r in runs])
            ratio = float(np.median(secs[:k] / np.array([r[0] for r in base[:k]])))
            diff = max(float(np.max(np.abs(r[2] - q[2]))) for r in runs for q in base)
            goal = "" if target is None or t == threads[0] else target(b)
            met = "" if not goal else (" (met)" if ratio <= float(goal.split()[-1]) else
                                       " (missed)")
            print(f"| {b} | {t} | {len(runs)} | {np.median(secs):.2f} s | {ratio:.3f} | "
                  f"{goal}{met} | {runs[0][1]:.4f} | {diff:.1e} |")
    print(flush=True)


def plain_target(b):
    return "≤ 0.85" if b <= 200 else "≤ 0.6"


def part_scaling(args, threads, burner=False):
    n = 40_000 if args.quick else args.n
    machine_table(("(b) with a busy-loop process on one core" if burner else
                   "(a) threads against one thread") + f": n = {n}, m = 200, one epoch",
                  **{"threads compared": ", ".join(map(str, threads)),
                     "burner": "pinned to core " + str(Burner().core) if burner else "none"})
    problem = peer_problem(n, args.test)
    if burner:
        with Burner():
            out = alternating(problem, args.batches, threads, args.repeats, args.max_seconds,
                              "[burner] ")
    else:
        out = alternating(problem, args.batches, threads, args.repeats, args.max_seconds)
    table(out, threads, (lambda b: "≤ 1.2") if burner else plain_target,
          f"{'(b) burner on one core' if burner else '(a)'}: n = {n}, m = 200, one epoch per fit,"
          f" thread counts alternating")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def part_peer(args, gpc_threads, devices, repeats, deadline=None):
    """gpc with each of ``gpc_threads`` against GPyTorch on each of ``devices`` [(device,
    dtype)] (all cores on the CPU), batch 2000, one epoch, alternating round by round; GPyTorch
    runs only while the wall-clock ``deadline`` (time.perf_counter) is not past."""
    n = 100_000 if args.quick else args.peer_n
    b = 2000
    try:
        import torch
        import gpytorch
        versions = f"torch {torch.__version__}, gpytorch {gpytorch.__version__}"
    except ImportError:
        torch = None
        versions = "not installed: pip install torch gpytorch"
    machine_table(f"(c) gpc against GPyTorch's SVGP: n = {n}, m = 200, batch {b}, one epoch",
                  **{"peer": versions, "gpc threads": ", ".join(map(str, gpc_threads)),
                     "GPyTorch threads (CPU)": str(cores())})
    Xtr, ytr, Xte, yte, Z0, ell = peer_problem(n, args.test)
    runs = {}
    start = time.perf_counter()
    for r in range(repeats):
        for t in gpc_threads:
            clf, wall, _ = sep_fit(Xtr, ytr, Z0, ell, b, n_jobs=t)
            p = clf.predict_proba(Xte)[:, 1]
            runs.setdefault(f"gpc minibatch SEP, {t} thread{'s' if t > 1 else ''}", []).append(
                (wall, _nll(p, yte)))
            print(f"round {r + 1}: gpc {t} thread(s) {wall:.2f} s, NLL {_nll(p, yte):.4f}; "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
        if torch is not None:
            for device_name, dtype in devices:
                if deadline is not None and time.perf_counter() > deadline:
                    print(f"no time left for GPyTorch on {device_name}")
                    continue
                p, wall, _ = gpytorch_fit(Xtr, ytr, Xte, Z0, ell, b, threads=cores(),
                                          device=device_name, dtype=dtype)
                where = f"{cores()} threads" if device_name == "cpu" else "GPU"
                runs.setdefault(f"GPyTorch SVGP, {device_name} {dtype}, {where}", []).append(
                    (wall, _nll(p, yte)))
                print(f"round {r + 1}: GPyTorch {device_name} {dtype} {wall:.2f} s, NLL "
                      f"{_nll(p, yte):.4f}; load {os.getloadavg()[0]:.2f}", flush=True)
        if time.perf_counter() - start > args.max_seconds and r + 1 < repeats:
            print(f"stopped after {r + 1} rounds (--max-seconds {args.max_seconds:g})")
            break
    peers = {k: float(np.median([w for w, _ in v])) for k, v in runs.items()
             if k.startswith("GPyTorch")}
    print(f"\n### (c): n = {n}, m = 200, batch {b}, one epoch (gpc's target: ≤ 0.5 × GPyTorch "
          f"on the CPU at equal or better NLL)\n")
    print("| what | rounds | epoch (median) | test NLL | " +
          " | ".join(f"÷ {k[len('GPyTorch SVGP, '):]}" for k in peers) + " |")
    print("| --- | --- | --- | --- |" + " --- |" * len(peers))
    for name, v in runs.items():
        secs = float(np.median([w for w, _ in v]))
        ratios = " | ".join("" if name in peers else f"{secs / w:.3f}" for w in peers.values())
        print(f"| {name} | {len(v)} | {secs:.2f} s | {v[0][1]:.4f} | {ratios} |")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}", flush=True)


def part_device(args):
    """The 16-core GPU machine's run, one round of each, about five minutes: the thread scaling at
    n = 200,000 (batches 200, 2000, 20000; 1, 2, 4, 8 and every core), then (c) with one thread
    and every core against GPyTorch on CUDA in float32 (when ``torch.cuda.is_available()``) and on
    the CPU (all cores), each GPyTorch run only while less than ``--peer-deadline`` seconds
    (default 420) have gone."""
    start = time.perf_counter()
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    n_cores = cores()
    threads = sorted({t for t in (1, 2, 4, 8, n_cores) if t <= n_cores})
    machine_table(f"device: scaling at n = {args.n}, m = 200, one epoch")
    out = alternating(peer_problem(args.n, args.test), args.batches, threads, 1, 0.0)
    table(out, threads, None, f"n = {args.n}, m = 200, one epoch each, {n_cores} cores")
    devices = ([("cuda", "float32")] if cuda else []) + [("cpu", "float64")]
    part_peer(args, [1, n_cores], devices, 1, deadline=start + args.peer_deadline)
    print(f"\ndevice run: {time.perf_counter() - start:.0f} s")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("plain", "burner", "peer", "device"), default="plain",
                    help="(a) plain, (b) burner, (c) peer, or the GPU machine's preset")
    ap.add_argument("--quick", action="store_true", help="a small smoke run of the part")
    ap.add_argument("--n", type=int, default=200_000, help="training rows of (a), (b)")
    ap.add_argument("--peer-n", type=int, default=1_000_000, help="training rows of (c)")
    ap.add_argument("--test", type=int, default=10_000, help="held-out rows")
    ap.add_argument("--batches", type=int, nargs="+", default=[200, 2000, 20000])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                    help="thread counts of (a), (b) (the first is the baseline); 0: every core")
    ap.add_argument("--repeats", type=int, default=None,
                    help="rounds (pairs) per batch size: default 3 for (a), (b) and 2 for (c)")
    ap.add_argument("--max-seconds", type=float, default=300.0,
                    help="no new round after this many seconds of a part")
    ap.add_argument("--peer-deadline", type=float, default=420.0,
                    help="--part device: no GPyTorch run after this many seconds of the part")
    args = ap.parse_args(argv)
    threads = [cores() if t == 0 else t for t in args.threads]
    if args.part == "device":
        return part_device(args)
    if args.part == "peer":
        return part_peer(args, [cores()], [("cpu", "float64")], args.repeats or 2)
    args.repeats = args.repeats or 3
    part_scaling(args, threads, burner=args.part == "burner")


if __name__ == "__main__":
    main()
