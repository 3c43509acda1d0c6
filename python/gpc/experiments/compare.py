"""``gpc compare``: cross-validated comparison of methods on one data set.

For each fold: standardise the inputs with the training fold's mean and deviation, fit
``GaussianProcessClassifier`` (kernel σ² exp(−‖x − x'‖²/2ℓ²), type-II ML over (log σ², log ℓ)) with each
method, and record the test error, the negative test log-likelihood (mean over test points of
−log p(y*|x*, D)), the log evidence at the fitted hyperparameters and the fit time.
"""

import json
import time
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from .. import datasets
from ..classifier import GaussianProcessClassifier
from ..exceptions import ConvergenceWarning
from ..kernels import ConstantKernel, RBF
from ._common import progress as progress_bar

#: method labels (the PL paper's names for the EP/PL schedules) -> (method, schedule)
METHOD_LABELS = {
    "laplace": ("laplace", None),
    "sep": ("ep", "sequential"),
    "pep": ("ep", "parallel"),
    "spl": ("pl", "sequential"),
    "ppl": ("pl", "parallel"),
    "kl": ("kl", None),
    "vb": ("vb", None),
    "mf-ensemble": ("mf-ensemble", None),
    "mf-naive": ("mf-naive", None),
    "online": ("online", None),
}


def stratified_folds(y, n_folds, seed):
    """Indices of ``n_folds`` test folds with the class proportions of y (shuffled with ``seed``)."""
    rng = np.random.default_rng(seed)
    folds = [[] for _ in range(n_folds)]
    offset = 0
    for cls in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == cls))
        for k, i in enumerate(idx):
            folds[(k + offset) % n_folds].append(i)
        offset += len(idx)
    return [np.sort(np.array(f, dtype=int)) for f in folds]


def default_kernel():
    return ConstantKernel(1.0, (1e-3, 1e4)) * RBF(1.0, (1e-2, 1e3))


def _fit_one(task):
    X_tr, y_tr, X_te, y_te, label, likelihood, seed = task
    method, schedule = METHOD_LABELS[label]
    mu, sd = X_tr.mean(axis=0), X_tr.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    X_tr, X_te = (X_tr - mu) / sd, (X_te - mu) / sd
    clf = GaussianProcessClassifier(kernel=default_kernel(), likelihood=likelihood, method=method,
                                    schedule=schedule, random_state=seed)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        try:
            clf.fit(X_tr, y_tr)
        except (ValueError, ArithmeticError) as exc:
            return {"method": label, "likelihood": likelihood, "error": None, "failure": str(exc)}
    seconds = time.perf_counter() - start
    proba = clf.predict_proba(X_te)
    col = np.searchsorted(clf.classes_, y_te)
    p_true = np.clip(proba[np.arange(len(y_te)), col], 1e-300, 1.0)
    return {"method": label, "likelihood": likelihood,
            "error": float(np.mean(clf.classes_[np.argmax(proba, axis=1)] != y_te)),
            "nll": float(-np.mean(np.log(p_true))),
            "log_evidence": float(clf.log_marginal_likelihood_value_),
            "fit_seconds": seconds,
            "warnings": sorted({str(w.message)[:120] for w in caught
                                if issubclass(w.category, ConvergenceWarning)})}


def run(X, y, labels, likelihoods, n_folds=5, seed=0, jobs=1, progress=None):
    """Cross-validate every (method label, likelihood) pair; returns one summary record per pair."""
    folds = stratified_folds(y, n_folds, seed)
    tasks = []
    for label in labels:
        for lik in likelihoods:
            if label == "laplace" and lik in ("noisy_threshold", "heaviside"):
                continue  # Laplace needs a gradient (PL paper §I)
            for k, test in enumerate(folds):
                train = np.setdiff1d(np.arange(len(y)), test)
                tasks.append((X[train], y[train], X[test], y[test], label, lik, seed + k))
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(progress_bar(pool.map(_fit_one, tasks), total=len(tasks), desc="fits", enabled=progress))
    else:
        results = [_fit_one(t) for t in progress_bar(tasks, total=len(tasks), desc="fits", enabled=progress)]
    return summarise(results, n_folds)


def summarise(results, n_folds):
    records = []
    keys = []
    for r in results:
        key = (r["method"], r["likelihood"])
        if key not in keys:
            keys.append(key)
    for key in keys:
        rs = [r for r in results if (r["method"], r["likelihood"]) == key]
        ok = [r for r in rs if r["error"] is not None]
        rec = {"method": key[0], "likelihood": key[1], "n_folds": n_folds, "n_failed": len(rs) - len(ok)}
        if ok:
            for field in ("error", "nll", "log_evidence", "fit_seconds"):
                vals = np.array([r[field] for r in ok])
                rec[f"{field}_mean"] = float(vals.mean())
                if field == "error":
                    rec["error_se"] = float(vals.std(ddof=1) / np.sqrt(len(vals))) if len(vals) > 1 else 0.0
        failures = sorted({r.get("failure", "") for r in rs if r["error"] is None})
        if failures:
            rec["failures"] = failures
        records.append(rec)
    return records


def format_table(records, title=""):
    head = f"{'method':<12} {'likelihood':<16} {'test error':>16} {'test NLL':>9} {'log evidence':>13} {'fit s':>7}"
    lines = [title, head, "-" * len(head)] if title else [head, "-" * len(head)]
    for r in records:
        if "error_mean" not in r:
            lines.append(f"{r['method']:<12} {r['likelihood']:<16} failed: {'; '.join(r.get('failures', []))[:80]}")
            continue
        err = f"{r['error_mean']:.3f} ± {r['error_se']:.3f}"
        lines.append(f"{r['method']:<12} {r['likelihood']:<16} {err:>16} {r['nll_mean']:>9.3f} "
                     f"{r['log_evidence_mean']:>13.2f} {r['fit_seconds_mean']:>7.2f}"
                     + (f"  ({r['n_failed']} folds failed)" if r["n_failed"] else ""))
    return "\n".join(lines)


LIKELIHOODS = ("probit", "logit", "noisy_threshold", "heaviside")


def load_data(args):
    """(X, y, name) from --csv/--label or --data, with errors a user can act on."""
    if args.csv:
        X, y = datasets.load_csv(args.csv, label=args.label, return_X_y=True)
        return X, y, args.csv
    if args.data not in datasets.available():
        raise ValueError(f"unknown data set {args.data!r}; available: {', '.join(datasets.available())}")
    X, y = datasets.load(args.data, return_X_y=True)
    return X, y, args.data


def check_methods(labels):
    """Method labels -> the same list; ValueError naming any unknown label."""
    unknown = [m for m in labels if m not in METHOD_LABELS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHOD_LABELS)}")
    return list(labels)


def main(args):
    if args.folds < 2:
        raise ValueError("--folds must be at least 2")
    if args.jobs < 1:
        raise ValueError("--jobs must be at least 1")
    labels = check_methods(args.methods or list(METHOD_LABELS))
    likelihoods = args.likelihood or ["probit"]
    bad = [lik for lik in likelihoods if lik not in LIKELIHOODS]
    if bad:
        raise ValueError(f"unknown likelihood(s) {', '.join(bad)}; choose from {', '.join(LIKELIHOODS)}")
    X, y, name = load_data(args)
    if getattr(args, "subsample", None) and args.subsample < len(y):
        if args.subsample < 2 * args.folds:
            raise ValueError(f"--subsample {args.subsample} is too small for {args.folds} folds")
        # the first fold of a stratified partition into len(y)/N parts is a stratified subset
        parts = max(2, int(np.floor(len(y) / args.subsample)))
        keep = stratified_folds(y, parts, args.seed)[0][: args.subsample]
        X, y = X[keep], y[keep]
        name = f"{name} (subsample {len(y)})"
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2:
        raise ValueError(f"{name} has one class only ({classes[0]!r})")
    if counts.min() < args.folds:
        raise ValueError(f"{name}: class {classes[np.argmin(counts)]!r} has {counts.min()} points, fewer "
                         f"than --folds {args.folds}")
    records = run(X, y, labels, likelihoods, n_folds=args.folds, seed=args.seed, jobs=args.jobs,
                  progress=not args.quiet)
    for r in records:
        r["dataset"] = name
    print(format_table(records, title=f"{name}: n = {len(y)}, d = {X.shape[1]}, {args.folds}-fold CV, "
                                         "kernel σ² exp(−‖x−x'‖²/2ℓ²), type-II ML"))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(records, fh, indent=2)
        print("wrote", args.out)
    if args.plot:
        from .plots import plot_compare
        print("wrote", plot_compare(records, args.plot, title=f"{name}, {args.folds}-fold CV"))
    return records
