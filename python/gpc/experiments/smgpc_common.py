"""Pieces shared by the scalable multi-class EP paper's experiments (``smgpc-uci``, ``smgpc-mnist``,
``smgpc-airline``).

Villacampa-Calvo & Hernández-Lobato, "Scalable Multi-Class Gaussian Process Classification using
Expectation Propagation" (ICML 2017, arXiv 1706.07258; "ICML'17" below) compare three ways to fit
one model, RMGPC's argmax likelihood with a fixed label-noise level ε on m inducing points per
class:

* **EP**: scalable EP with one site per point and class pair (:class:`gpc.SparseMultiClassGPC`,
  ``tied_sites=False``), in batch or on minibatches;
* **SEP**: stochastic EP, one tied site per class (``tied_sites=True``), memory O(C m²);
* **VI**: the variational baseline (``method="vi"``), run only where the installed estimator has it
  (:func:`vi_available`).

Every method starts from the same random training rows as inducing points (shared by the classes
at the start, moved per class).  EP and SEP start per class at the SEP reproductions' kernel, an ARD
squared exponential with amplitude and additive noise (:func:`.sep_common.ard_kernel`), and learn ε
from EPS0 with the other hyperparameters.  VI is set up as the authors' ``vi_multiclass_batch.R``
(:func:`start_kernel`, :func:`make_classifier`): ε held at their 10⁻³ and the kernel started at
σ² = σ₀² = 1 with their length-scale heuristic.  Learning ε in VI drives it to 1 − P̄, P̄ the mean
over the training rows of q's probability that the label is the argmax (0.2–0.3 on glass), which
flattens the predictions; docs/reproduction-smgpc.md ("VI on glass") measures both choices.
"""

import numpy as np

from ..multiclass.sparse_estimator import SparseMultiClassGPC
from ._common import count_convergence_warnings, map_tasks, multiclass_scores
from .sep_common import ard_kernel, random_rows, timed_fit
from .sep_curves import CheckpointHook, curve_record
from .smgpc_authors import kernel as authors_kernel, length_scale, vi_label_noise

#: the starting value of the label noise ε (learnt within the estimator's default bounds)
EPS0 = 1e-3
#: the site damping of EP and SEP in every schedule, RMGPC §3's value (the estimator's default;
#: passed explicitly so that the records say what ran)
DAMPING = 0.5
#: the paper's method labels, in its order
METHOD_ORDER = ("ep", "sep", "vi")


def vi_available():
    """Whether the installed :class:`gpc.SparseMultiClassGPC` has the variational baseline
    (a ``method`` parameter that accepts "vi")."""
    return "method" in SparseMultiClassGPC().get_params()


def available_methods():
    """The paper's methods this installation runs: EP and SEP always, VI where it exists."""
    return tuple(m for m in METHOD_ORDER if m != "vi" or vi_available())


def check_methods(methods, experiment, extra=()):
    """Raise a clear ValueError for a method that is not one of the paper's (or ``extra``), or that
    this installation cannot run (VI without ``method="vi"``)."""
    known = METHOD_ORDER + tuple(extra)
    for m in methods:
        if m not in known:
            raise ValueError(f"unknown method {m!r} for {experiment}; choose from {', '.join(known)}")
        if m == "vi" and not vi_available():
            raise ValueError(f"{experiment}: method 'vi' needs a SparseMultiClassGPC with "
                             "method='vi', which this installation does not have")


def start_kernel(method, X):
    """The starting kernel of ``method`` on the standardised training inputs X: for EP and SEP
    :func:`.sep_common.ard_kernel` (σ² = 1, ℓ_j = √d, σ₀² = 0.01); for VI the authors' (σ² = σ₀² = 1,
    ℓ_j = √(median distance between the rows of X), :func:`.smgpc_authors.kernel`)."""
    if method == "vi":
        return authors_kernel(X.shape[1], length_scale(X))
    return ard_kernel(X.shape[1])


def make_classifier(method, Z, kernel, max_iter, seed, n_classes, batch_size=None,
                    validation_data=None, cls=SparseMultiClassGPC):
    """The paper's ``method`` ("ep", "sep" or "vi") as a :class:`gpc.SparseMultiClassGPC` (or
    ``cls``) on the initial inducing points Z (every class starts at them) and ``kernel`` (cloned
    for every class), one thread (the experiments time CPU).

    EP and SEP: the fixed-ε likelihood with ε learnt from EPS0, sites damped by DAMPING.  VI: the
    authors' likelihood, ε = 10⁻³ held fixed, which on ``n_classes`` classes is gpc's
    ``label_noise`` = 10⁻³(C − 1)/C (:func:`.smgpc_authors.vi_label_noise`).
    """
    options = {"tied_sites": method == "sep", "damping": DAMPING, "label_noise": EPS0}
    if method == "vi":
        options = {"method": "vi", "label_noise": vi_label_noise(n_classes),
                   "label_noise_bounds": "fixed"}
    return cls(kernel=kernel, n_inducing=len(Z), inducing_points=Z, batch_size=batch_size,
               max_iter=max_iter, validation_data=validation_data, progress=False,
               random_state=seed, n_jobs=1, **options)


def trivial_scores(y_train, y_test):
    """(error, NLL) of the constant predictor that answers the training class frequencies (a floor
    that any classifier worth its fit must beat)."""
    classes, counts = np.unique(y_train, return_counts=True)
    freq = np.clip(counts / counts.sum(), 1e-3, 1.0)
    seen = np.isin(y_test, classes)
    proba = np.tile(freq / freq.sum(), (int(seen.sum()), 1))
    return multiclass_scores(proba, classes, np.asarray(y_test)[seen])


class _CheckpointedMultiClass(CheckpointHook, SparseMultiClassGPC):
    """The sparse multi-class classifier, scored inside its minibatch epochs (``checkpoints_``)."""


#: variant name -> (the paper's method, minibatch size or None)
VARIANTS = {"ep-minibatch": ("ep", 200), "sep-minibatch": ("sep", 200),
            "vi-minibatch": ("vi", 200), "ep-batch": ("ep", None), "sep-batch": ("sep", None),
            "vi-batch": ("vi", None)}


def default_variants():
    """The minibatch variants of the methods this installation runs (the paper's large-data set-up)."""
    methods = available_methods()
    return [v for v, (m, b) in VARIANTS.items() if b is not None and m in methods]


def _fit_variant(task):
    X_tr, y_tr, X_te, y_te, variant, Z, kernel, epochs, seed = task
    method, batch_size = VARIANTS[variant]
    cls = SparseMultiClassGPC if batch_size is None else _CheckpointedMultiClass
    clf = make_classifier(method, Z, kernel, epochs, seed, len(np.unique(y_tr)),
                          batch_size=batch_size, validation_data=(X_te, y_te), cls=cls)
    with count_convergence_warnings():
        try:
            cpu, _ = timed_fit(clf, X_tr, y_tr)
        except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
            return {"variant": variant, "method": method, "failure": f"{type(exc).__name__}: {exc}"[:200]}
    record = curve_record(clf, variant, method, batch_size)
    record.update(cpu_seconds=cpu, label_noise=clf.label_noise_,
                  log_marginal_likelihood=clf.log_marginal_likelihood_value_)
    return record


def run_variants(X_tr, y_tr, X_te, y_te, variants, m, epochs, kernel, seed=0, jobs=1, progress=True,
                 desc="fits"):
    """One record per variant: test error and NLL after every epoch (``seconds`` since the fit
    started, which include the earlier scorings) and inside the minibatch epochs (``checkpoints``).

    Every variant starts from the same m random training rows as inducing points and the same
    kernel; ``epochs`` maps a variant to its passes over the data.
    """
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    check_methods({VARIANTS[v][0] for v in variants}, desc.split()[0])
    if not 1 <= m <= len(y_tr):
        raise ValueError(f"--n-inducing must be in 1..{len(y_tr)}, got {m}")
    Z = X_tr[random_rows(len(X_tr), m, seed)]
    tasks = [(X_tr, y_tr, X_te, y_te, v, Z, kernel, epochs[v], seed) for v in variants]
    return map_tasks(_fit_variant, tasks, jobs=jobs, desc=desc, show=progress)
