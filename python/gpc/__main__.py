"""``python -m gpc`` / ``gpc``: the command line.

    gpc compare [--data NAME | --csv FILE --label COL] [--methods …] [--likelihood …] [--folds K]
                [--jobs N] [--out results.json] [--plot out.png]
    gpc reproduce NAME [--out results.json] [--plots DIR] [--folds K] [--datasets …] [--methods …]
    gpc sep-distributed [--dask-workers N … | --scheduler ADDRESS] [--data NAME | --synthetic N]
                        [--batch-size B]

Errors the user can fix (a missing file, an unknown data set, method or column) end with a
one-line message and exit status 2, not a traceback.
"""

import argparse
import sys


def build_parser():
    from .experiments.compare import METHOD_LABELS
    from .experiments.reproduce import add_parsers

    parser = argparse.ArgumentParser(prog="gpc", description="Gaussian process classification")
    sub = parser.add_subparsers(dest="command", required=True)

    cmp_ = sub.add_parser("compare", help="cross-validate the methods on a data set",
                          description="Cross-validated test error, negative test log-likelihood, log "
                                      "evidence and fit time per method and likelihood.")
    src = cmp_.add_mutually_exclusive_group()
    src.add_argument("--data", default="crabs", help="a bundled binary data set (see gpc.datasets.available())")
    src.add_argument("--csv", help="a CSV file with a header row")
    cmp_.add_argument("--label", default="label", help="the label column of --csv (default: label)")
    cmp_.add_argument("--methods", nargs="+", metavar="M", help=f"method labels ({', '.join(METHOD_LABELS)})")
    cmp_.add_argument("--likelihood", nargs="+", metavar="L",
                      help="probit, logit, noisy_threshold, heaviside (default probit)")
    cmp_.add_argument("--folds", type=int, default=5)
    cmp_.add_argument("--seed", type=int, default=0)
    cmp_.add_argument("--subsample", type=int, metavar="N",
                      help="use a seeded stratified subset of N points (a quick look at a large set)")
    cmp_.add_argument("--jobs", type=int, default=1, help="processes for the folds")
    cmp_.add_argument("--out", help="write the records as JSON")
    cmp_.add_argument("--plot", help="write a PNG chart of error and NLL per method (needs matplotlib)")
    cmp_.add_argument("--quiet", action="store_true", help="no progress bar")

    add_parsers(sub)
    from .distributed.cli import add_parser as add_distributed
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
            from .distributed import cli
            cli.main(args)
    except (FileNotFoundError, ValueError) as exc:
        msg = str(exc)
        if isinstance(exc, FileNotFoundError) and exc.filename and exc.filename not in msg:
            msg = f"{msg}: {exc.filename}"
        parser.exit(2, f"gpc {args.command}: error: {msg}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
