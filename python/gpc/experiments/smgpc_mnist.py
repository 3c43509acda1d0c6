"""``gpc reproduce smgpc-mnist``: the ICML'17 paper's MNIST experiment, ten classes, on Fashion-MNIST.

MNIST is not installable from the registries this project may use; as in ``sep-mnist`` its stand-in
is Fashion-MNIST (the same format and size: 60,000 training and 10,000 test images of 784 pixels,
ten classes), read from the four IDX files of the Debian package ``dataset-fashion-mnist`` whose
directory ``--data-dir`` names (``dpkg -L dataset-fashion-mnist``).  Here the ten class codes are
the labels.  Pixels are scaled to [0, 1].

Protocol: the minibatch methods of :mod:`.smgpc_common` (EP with per-row sites, SEP with tied
sites, VI where the estimator has it) with m = 200 inducing points per class started at the same
random training rows, minibatches of 200 rows (Adadelta on the hyperparameters, Z and ε), per class
an ARD squared exponential with amplitude and noise, every length-scale started at the median
distance between images; the test error and NLL on the 10,000 test images after every epoch and
ten times inside each, against the training time.  ``--subsample N`` trains on N seeded rows and
``--n-inducing`` changes m (a reduced run).
"""

import os

import numpy as np

from ..datasets._idx import FILES, load_fashion_mnist, read_idx
from .publish import publish_doc_tables, read_records
from .sep_common import ard_kernel
from .sep_curves import add_curve_arguments, doc_table, epochs_of, format_curves, subsample
from .sep_mnist import median_distance
from .smgpc_common import VARIANTS, default_variants, run_variants


def load(data_dir, part):
    """(X in [0, 1], class codes 0-9) of the "train" or "test" part; a missing directory or file is
    a clear error naming ``--data-dir`` and the Debian package."""
    X, _ = load_fashion_mnist(data_dir, part, option="--data-dir")
    return X, read_idx(os.path.join(data_dir, FILES[part][1])).astype(np.int64)


def add_arguments(parser):
    parser.add_argument("--data-dir", help="directory of the Fashion-MNIST IDX files (Debian package "
                                           "dataset-fashion-mnist)")
    add_curve_arguments(parser, epochs_minibatch=3, epochs_batch=20, variants=VARIANTS)


def main(args):
    if args.folds is not None or args.datasets:
        raise ValueError("smgpc-mnist has one data set and its own train/test split")
    if args.from_json:
        records = read_records(args.from_json)
        title = "smgpc-mnist on Fashion-MNIST (records of an earlier run)"
    else:
        variants = args.variants or default_variants()
        X_tr, y_tr = subsample(*load(args.data_dir, "train"), args.subsample, args.seed)
        X_te, y_te = load(args.data_dir, "test")
        kernel = ard_kernel(X_tr.shape[1], median_distance(X_tr, args.seed))
        records = run_variants(X_tr, y_tr, X_te, y_te, variants, args.n_inducing,
                               epochs_of(variants, args, VARIANTS), kernel, args.seed, args.jobs,
                               not args.quiet, desc="smgpc-mnist fits")
        title = (f"smgpc-mnist on Fashion-MNIST, 10 classes ({len(y_tr)} training rows, m = "
                 f"{args.n_inducing} per class)")
    print(format_curves(records, title))
    if args.plots:
        from .sep_plots import plot_time_curves
        print("wrote", plot_time_curves(records, args.plots, "smgpc-mnist.png",
                                        "Fashion-MNIST, 10 classes: multi-class EP and SEP"))
    if args.from_json or args.update_doc:
        publish_doc_tables(args, doc_table(records, "smgpc-mnist"))
    return records
