"""``python -m gpc`` / ``gpc``: the command line."""

import argparse
import sys


def build_parser():
    from .experiments.compare import METHOD_LABELS

    parser = argparse.ArgumentParser(prog="gpc", description="Gaussian process classification")
    sub = parser.add_subparsers(dest="command", required=True)

    cmp_ = sub.add_parser("compare", help="cross-validate the methods on a data set")
    src = cmp_.add_mutually_exclusive_group()
    src.add_argument("--data", default="crabs", help="a bundled data set (see gpc.datasets.available())")
    src.add_argument("--csv", help="a CSV file with a header row")
    cmp_.add_argument("--label", default="label", help="the label column of --csv (default: label)")
    cmp_.add_argument("--methods", nargs="+", metavar="M", help=f"method labels ({', '.join(METHOD_LABELS)})")
    cmp_.add_argument("--likelihood", nargs="+", metavar="L",
                      help="probit, logit, noisy_threshold, heaviside (default probit)")
    cmp_.add_argument("--folds", type=int, default=5)
    cmp_.add_argument("--seed", type=int, default=0)
    cmp_.add_argument("--jobs", type=int, default=1, help="processes for the folds")
    cmp_.add_argument("--out", help="write the records as JSON")
    cmp_.add_argument("--plot", help="write a PNG bar chart (needs matplotlib)")
    cmp_.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "compare":
        from .experiments import compare
        from . import datasets

        if args.folds < 2:
            parser.error("--folds must be at least 2")
        if args.csv is None and args.data not in datasets.available():
            parser.error(f"unknown data set {args.data!r}; available: {', '.join(datasets.available())}")
        try:
            compare.main(args)
        except FileNotFoundError as exc:
            parser.error(str(exc))
        except ValueError as exc:
            parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
