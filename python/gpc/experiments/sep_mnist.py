"""``gpc reproduce sep-mnist``: SEP paper, Figure 4 top (MNIST, odd against even digits).

MNIST itself is not installable from the registries this project may use; its stand-in is
Fashion-MNIST (Xiao, Rasul & Vollgraf 2017), the same format and size (60,000 training and 10,000
test images of 28 x 28 = 784 pixels, ten classes), which Debian ships as the package
``dataset-fashion-mnist`` (four gzipped IDX files).  Pass their directory with ``--data-dir``
(``dpkg -L dataset-fashion-mnist`` lists it); nothing is downloaded.  The split copies the paper's
digits one: odd class codes (1 trouser, 3 dress, 5 sandal, 7 sneaker, 9 ankle boot) are +1, even
ones (0 T-shirt, 2 pullover, 4 coat, 6 shirt, 8 bag) are -1.  Pixels are scaled to [0, 1].

Protocol (SEP §4.4): m = 200 inducing points (random training rows, shared), ARD squared
exponential + amplitude + noise with every length-scale started at the median distance between
images, SEP and SVI trained in batch and on minibatches of 200 (Adadelta), test error and NLL
against training time.  The paper's numbers are on MNIST (SEP 1.8 % / 0.0528, SVI 2.0 % / 0.0654)
and are not comparable with Fashion-MNIST's, whose classes overlap far more.
"""

import numpy as np

from ..datasets._idx import FILES, load_fashion_mnist, read_idx  # noqa: F401  (the experiment's names)
from .publish import publish_doc_tables, read_records
from .sep_common import ard_kernel
from .sep_curves import (VARIANTS, add_curve_arguments, doc_table, epochs_of, format_curves,
                         run_variants, subsample)

PAPER = {"sep": (0.018, 0.0528), "svi": (0.020, 0.0654)}


def load(data_dir, part):
    """(X in [0, 1], ±1 labels: odd class codes +1) of the "train" or "test" part
    (:func:`gpc.datasets._idx.load_fashion_mnist`)."""
    return load_fashion_mnist(data_dir, part, option="--data-dir")


def median_distance(X, seed, rows=1000):
    """The median distance between rows of a seeded subsample (the length-scale start)."""
    S = X[np.random.default_rng(seed).choice(len(X), size=min(rows, len(X)), replace=False)]
    sq = np.sum(S * S, axis=1)
    D2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * S @ S.T, 0.0)
    return float(np.sqrt(np.median(D2[np.triu_indices(len(S), 1)])))


def add_arguments(parser):
    parser.add_argument("--data-dir", help="directory of the Fashion-MNIST IDX files")
    add_curve_arguments(parser, epochs_minibatch=5, epochs_batch=20)


def main(args):
    if args.folds is not None or args.datasets:
        raise ValueError("sep-mnist has one data set and its own train/test split")
    if args.from_json:
        records = read_records(args.from_json)
        n_train = "?"
    else:
        variants = args.variants or list(VARIANTS)
        X_tr, y_tr = subsample(*load(args.data_dir, "train"), args.subsample, args.seed)
        X_te, y_te = load(args.data_dir, "test")
        kernel = ard_kernel(X_tr.shape[1], median_distance(X_tr, args.seed))
        records = run_variants(X_tr, y_tr, X_te, y_te, variants, args.n_inducing,
                               epochs_of(variants, args), kernel, args.seed, args.jobs,
                               not args.quiet, desc="sep-mnist fits")
        n_train = len(y_tr)
    print(format_curves(records, f"SEP Figure 4 top on Fashion-MNIST odd vs even ({n_train} "
                                 f"training rows, m = {args.n_inducing}); paper on MNIST: SEP "
                                 "1.8 % / 0.0528, SVI 2.0 % / 0.0654"))
    if args.plots:
        from .sep_plots import plot_time_curves
        print("wrote", plot_time_curves(records, args.plots, "sep-mnist.png",
                                        "Fashion-MNIST (odd vs even classes): SEP and SVI"))
    if args.from_json or args.update_doc:
        publish_doc_tables(args, doc_table(records, "sep-mnist"))
    return records
