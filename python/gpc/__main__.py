"""``python -m gpc`` / ``gpc``: the command line.

    gpc compare [--data NAME | --csv FILE --label COL] [--section exact|sparse|multiclass …]
                [--methods …] [--likelihood …] [--folds K] [--inducing M …] [--exact-rows N …]
                [--quick] [--jobs N] [--out results.json] [--plot out.png]
    gpc reproduce NAME [--out results.json] [--plots DIR] [--folds K] [--datasets …] [--methods …]
    gpc sep-distributed [--dask-workers N … | --scheduler ADDRESS] [--data NAME | --synthetic N]
                        [--batch-size B]

Errors the user can fix (a missing file, an unknown data set, method or column) end with a
one-line message and exit status 2, not a traceback.
"""

import argparse
import sys


def build_parser():
    from .experiments.compare import LARGE, SECTIONS, section_methods
    from .experiments.reproduce import add_parsers

    parser = argparse.ArgumentParser(prog="gpc", description="Gaussian process classification")
    sub = parser.add_subparsers(dest="command", required=True)

    cmp_ = sub.add_parser(
        "compare", help="the estimators side by side: exact, sparse and multi-class",
        description="With no arguments: three sections, one per estimator. exact: every method of "
                    "GaussianProcessClassifier, cross-validated on crabs; sparse: "
                    "SparseGaussianProcessClassifier (sparse-ep, gfitc, svi) at a few inducing-point "
                    "counts against exact EP on subsets, on a held-out split of banana (5,300 rows); "
                    "multiclass: MultiClassGPC (rmgpc, smgpc, htpc) and one-vs-rest EP on glass (six classes), "
                    "with the training rows most likely mislabelled. Test error, test NLL and fit CPU "
                    "time for every fit. With --data or --csv the data set picks the section (more than "
                    f"two classes: multiclass; more than {LARGE} rows: sparse; else exact) unless "
                    "--section or --methods names one.")
    src = cmp_.add_mutually_exclusive_group()
    src.add_argument("--data", help="a bundled data set (gpc.datasets.available()); default: crabs, banana "
                                    "and glass, one per section")
    src.add_argument("--csv", help="a CSV file with a header row")
    cmp_.add_argument("--label", default="label", help="the label column of --csv (default: label)")
    cmp_.add_argument("--section", nargs="+", choices=SECTIONS,
                      help="run these sections only (with --data/--csv: run them on that set)")
    cmp_.add_argument("--methods", nargs="+", metavar="M",
                      help="method labels, unique across sections; "
                           + "; ".join(f"{s}: {', '.join(m)}" for s, m in section_methods().items()))
    cmp_.add_argument("--likelihood", nargs="+", metavar="L",
                      help="probit, logit, noisy_threshold, heaviside (default probit; the binary sections)")
    cmp_.add_argument("--folds", type=int, help="cross-validation folds of the exact section (default 5)")
    cmp_.add_argument("--inducing", type=int, nargs="+", metavar="M",
                      help="inducing-point counts of the sparse section (default 8 32)")
    cmp_.add_argument("--exact-rows", type=int, nargs="+", metavar="N",
                      help="training rows of the sparse section's exact EP baseline (default 500 1000)")
    cmp_.add_argument("--sparse-iter", type=int, metavar="K",
                      help="the sparse estimator's max_iter: epochs, or GFITC's and SVI's objective "
                           "evaluations (default 100)")
    cmp_.add_argument("--quick", action="store_true",
                      help="a smaller budget: 2 folds, banana subsampled to 1200 and glass to 100 "
                           "rows, m = 8, exact EP on 200 rows, 20 sparse iterations")
    cmp_.add_argument("--seed", type=int, default=0)
    cmp_.add_argument("--subsample", type=int, metavar="N",
                      help="use a seeded stratified subset of N points (a quick look at a large set)")
    cmp_.add_argument("--jobs", type=int, default=1, help="processes for the fits")
    cmp_.add_argument("--threads", type=int, default=1,
                      help="BLAS threads per fit (default 1)")
    cmp_.add_argument("--out", help="write every section's records as JSON")
    cmp_.add_argument("--plot", help="write a PNG of test error and NLL against fit time, a column per "
                                     "section (needs matplotlib)")
    cmp_.add_argument("--quiet", action="store_true",
                      help="no progress lines (one per section and per method, on stderr)")

    add_parsers(sub)
    from .experiments.sep_distributed import add_parser as add_distributed
    add_distributed(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)

    try:
        if args.command == "compare":
            from .experiments import compare
            compare.main(args)
        elif args.command == "reproduce":
            from .experiments import reproduce
            reproduce.main(args)
        elif args.command == "sep-distributed":
            from .experiments import sep_distributed
            sep_distributed.main(args)
    except (FileNotFoundError, ValueError) as exc:
        msg = str(exc)
        if isinstance(exc, FileNotFoundError) and exc.filename and exc.filename not in msg:
            msg = f"{msg}: {exc.filename}"
        parser.exit(2, f"gpc {args.command}: error: {msg}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
