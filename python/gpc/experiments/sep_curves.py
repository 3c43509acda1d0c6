"""Test error and NLL against training time for SEP and SVI, batch and minibatch (SEP §4.4-§4.5).

Shared by ``sep-mnist`` and ``sep-airline``: every variant starts from the same inducing points
(random training rows) and kernel, is scored on the test rows after every epoch (the estimator's
``validation_data``; ``history_`` holds the wall time since the fit started, which includes the
earlier scorings), and the curve is one point per epoch.  Minibatch variants use Adadelta
(ρ = 0.9, ε = 1e-5, the estimator's default, as in the paper); batch SEP runs under the divergence
guard of :func:`.sep_common.fit_with_divergence_guard`.  Minibatch variants are also scored
CHECKPOINTS_PER_EPOCH times inside each epoch (the record's ``checkpoints``), so that a curve shows
when it crosses a baseline even when that happens in the first epoch.
"""

import time

import numpy as np

from ..sparse import SparseGaussianProcessClassifier
from ._common import count_convergence_warnings, map_tasks
from .sep_common import add_doc_arguments, make_classifier, markdown_table, random_rows, train

#: variant name -> (paper's method, minibatch size or None)
VARIANTS = {"sep-minibatch": ("sep", 200), "svi-minibatch": ("svi", 200),
            "sep-batch": ("sep", None), "svi-batch": ("svi", None)}

#: test scorings inside each minibatch epoch (the epoch's end is scored by ``history_``)
CHECKPOINTS_PER_EPOCH = 10


class _Checkpoints:
    """The progress hook of a minibatch fit: scores the validation rows every ``every`` steps inside
    an epoch of ``per_epoch`` steps (not at its end, which ``history_`` scores), into ``points`` as
    (seconds since the fit started, error, NLL)."""

    def __init__(self, clf, per_epoch):
        self.clf, self.per_epoch, self.steps, self.points = clf, per_epoch, 0, []
        self.every = max(1, per_epoch // CHECKPOINTS_PER_EPOCH)

    def update(self, k=1):
        self.steps += k
        step = self.steps % self.per_epoch
        if step and step % self.every == 0:
            seconds = time.perf_counter() - self.clf._start
            self.points.append((seconds, *self.clf._validation_scores()))

    def close(self):
        pass


class CheckpointHook:
    """Mixin for a sparse estimator: :class:`_Checkpoints` as its progress hook (minibatch fits),
    left in ``checkpoints_``."""

    def _progress_bar(self, epochs, steps_per_epoch):
        self.checkpoints_ = _Checkpoints(self, steps_per_epoch)
        return self.checkpoints_


class _CheckpointedClassifier(CheckpointHook, SparseGaussianProcessClassifier):
    """The binary sparse classifier with :class:`_Checkpoints` as its progress hook."""


def _fit_variant(task):
    X_tr, y_tr, X_te, y_te, variant, Z, kernel, epochs, seed = task
    method, batch_size = VARIANTS[variant]
    clf = make_classifier(method, Z, epochs, seed, batch_size=batch_size,
                          validation_data=(X_te, y_te), kernel=kernel)
    if batch_size is not None:
        clf = _CheckpointedClassifier(**clf.get_params(deep=False))
    with count_convergence_warnings():
        try:
            clf, _, _, stopped = train(method, clf, X_tr, y_tr, epochs)
        except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
            return {"variant": variant, "method": method, "failure": f"{type(exc).__name__}: {exc}"[:200]}
    return curve_record(clf, variant, method, batch_size, stopped)


def curve_record(clf, variant, method, batch_size, stopped=None):
    """The record of one fitted variant: its ``history_`` as curves (seconds, error, nll: one
    point per epoch, scored on ``validation_data``), the final error and NLL and, for a minibatch
    fit with :class:`CheckpointHook`, the scorings inside the epochs (``checkpoints``)."""
    h = clf.history_
    record = {"variant": variant, "method": method, "batch_size": batch_size,
              "seconds": [e["seconds"] for e in h], "error": [e["val_error"] for e in h],
              "nll": [e["val_nll"] for e in h], "final_error": h[-1]["val_error"],
              "final_nll": h[-1]["val_nll"], "stopped": stopped}
    if batch_size is not None:
        record["checkpoints"] = dict(zip(("seconds", "error", "nll"),
                                         map(list, zip(*clf.checkpoints_.points))))
    return record


def run_variants(X_tr, y_tr, X_te, y_te, variants, m, epochs, kernel, seed=0, jobs=1, progress=True,
                 desc="fits"):
    """One record per variant: the per-epoch curves (seconds, error, nll) on the test rows.

    ``epochs`` maps a variant to its epochs (passes over the data; L-BFGS-B evaluations for batch
    SVI).
    """
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    Z = X_tr[random_rows(len(X_tr), m, seed)]
    tasks = [(X_tr, y_tr, X_te, y_te, v, Z, kernel, epochs[v], seed) for v in variants]
    return map_tasks(_fit_variant, tasks, jobs=jobs, desc=desc, show=progress)


def format_curves(records, title):
    lines = [title, f"{'variant':<15}{'epochs':>7}{'seconds':>10}{'error':>8}{'NLL':>8}"]
    for r in records:
        if "failure" in r:
            lines.append(f"{r['variant']:<15}  failed: {r['failure']}")
        else:
            lines.append(f"{r['variant']:<15}{len(r['seconds']):>7}{r['seconds'][-1]:>10.1f}"
                         f"{r['final_error']:>8.4f}{r['final_nll']:>8.4f}")
    return "\n".join(lines)


def doc_table(records, name):
    """A markdown table for docs/reproduction.md: one row per variant (logistic regression, when
    present, last), after its first epoch / pass and at its end: seconds since the fit started,
    test error and NLL."""
    rows = []
    for r in records:
        if "failure" in r:
            rows.append([r["variant"], "failed", "", ""])
            continue
        first = f"{r['seconds'][0]:.0f} s, {100 * r['error'][0]:.2f} %, {r['nll'][0]:.4f}"
        last = f"{r['seconds'][-1]:.0f} s, {100 * r['error'][-1]:.2f} %, {r['nll'][-1]:.4f}"
        rows.append([r["variant"], str(len(r["seconds"])), first, last])
    header = ["variant", "epochs / evaluations", "after the first: time, error, NLL",
              "at the end: time, error, NLL"]
    return {name: markdown_table(header, rows)}


def add_curve_arguments(parser, epochs_minibatch, epochs_batch, variants=VARIANTS,
                        subsample_flags=("--subsample",)):
    """The curve experiments' options; ``variants`` maps a variant to (method, minibatch size or
    None), ``subsample_flags`` names the option that caps the training rows."""
    parser.add_argument("--variants", nargs="+", metavar="V", choices=list(variants),
                        help=f"subset of {', '.join(variants)}")
    parser.add_argument("--epochs", type=int, default=epochs_minibatch,
                        help=f"passes over the data of the minibatch variants (default {epochs_minibatch})")
    parser.add_argument("--batch-iterations", type=int, default=epochs_batch,
                        help=f"iterations of the batch variants (default {epochs_batch})")
    parser.add_argument("--n-inducing", type=int, default=200, help="m (default 200, as in the paper)")
    parser.add_argument(*subsample_flags, type=int, metavar="N", dest="subsample",
                        help="train on a seeded subset of N training rows (a quick look)")
    add_doc_arguments(parser)


def epochs_of(variants, args, table=VARIANTS):
    """{variant: epochs}: ``--epochs`` for the minibatch variants of ``table``, ``--batch-iterations``
    for the batch ones."""
    if args.epochs < 1 or args.batch_iterations < 1:
        raise ValueError("--epochs and --batch-iterations must be at least 1")
    return {v: (args.epochs if table[v][1] else args.batch_iterations) for v in variants}


def subsample(X, y, n, seed):
    """A seeded subset of n rows (all when n is None)."""
    if n is None:
        return X, y
    if not 2 <= n <= len(y):
        raise ValueError(f"--subsample must be in 2..{len(y)}, got {n}")
    idx = np.sort(np.random.default_rng(seed).choice(len(y), size=n, replace=False))
    return X[idx], y[idx]
