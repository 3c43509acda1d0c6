"""CPU seconds of SparseMultiClassGPC's fits in the authors' batch set-up (``smgpc-authors``).

Fits EP, SEP and VI on split 1 of a few of the paper's UCI sets exactly as
``gpc reproduce smgpc-authors`` does (gpc.experiments.smgpc_authors._fit: standardised inputs,
m = 100 inducing points per class, 250 iterations) and prints, per (data set, method), the
median of ``--repeats`` runs' ``time.process_time`` of the fit, with the test error, the test
NLL and the final log evidence (or VI's bound) printed to all their digits, so that two commits
can be compared for speed and for equal results.  Run it on one BLAS thread::

    OPENBLAS_NUM_THREADS=1 nice -n 5 python bench/bench_smgpc_cpu.py --json out.json
"""

import argparse
import json
import os
import statistics

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from gpc.experiments import smgpc_authors  # noqa: E402

SETS = ("glass", "new-thyroid", "wine", "svmguide2")
METHODS = ("ep", "sep", "vi")


def one(name, method, split, iterations):
    """One fit's record (gpc.experiments.smgpc_authors._fit) with its final log evidence."""
    captured = {}
    original = smgpc_authors.timed_fit

    def timed(clf, X, y):
        out = original(clf, X, y)
        captured["log_evidence"] = float(clf.log_marginal_likelihood_value_)
        return out

    smgpc_authors.timed_fit = timed
    try:
        rec = smgpc_authors._fit((name, split - 1, method, smgpc_authors.M, iterations))
    finally:
        smgpc_authors.timed_fit = original
    rec.update(captured)
    return rec


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--split", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=smgpc_authors.ITERATIONS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args()
    out = []
    for name in args.sets:
        for method in args.methods:
            runs = [one(name, method, args.split, args.iterations) for _ in range(args.repeats)]
            first = runs[0]
            same = all(r.get(k) == first.get(k) for r in runs
                       for k in ("error", "nll", "log_evidence"))
            rec = dict(first, cpu_s=statistics.median(r["cpu_s"] for r in runs),
                       cpu_runs=[r["cpu_s"] for r in runs], repeatable=same)
            out.append(rec)
            print(f"{name:<12}{method:<5}cpu {rec['cpu_s']:7.3f} s  error {rec.get('error')!r}  "
                  f"nll {rec.get('nll')!r}  log_evidence {rec.get('log_evidence')!r}"
                  f"{'' if same else '  (runs differ)'}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
