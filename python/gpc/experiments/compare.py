"""``gpc compare``: the library's three estimators side by side, one section each.

* **exact** (this module): ``GaussianProcessClassifier`` with every exact-engine method, cross-validated
  on a small binary set (crabs).  For each fold: standardise the inputs with the training fold's mean
  and deviation, fit (kernel σ² exp(−‖x − x'‖²/2ℓ²), type-II ML over (log σ², log ℓ)) and record the
  test error, the negative test log-likelihood (mean over test points of −log p(y*|x*, D)), the log
  evidence at the fitted hyperparameters and the fit time.
* **sparse** (:mod:`.compare_sparse`): ``SparseGaussianProcessClassifier`` ("sparse-ep", "gfitc",
  "svi") at a few numbers of inducing points against exact EP on subsets, on a held-out split of a
  set too large for exact methods (banana).
* **multiclass** (:mod:`.compare_multiclass`): ``MultiClassGPC`` (RMGPC, SMGPC, HTPC) and one-vs-rest
  EP on a held-out split of a multi-class set (glass, six classes), with the training rows RMGPC
  finds most likely mislabelled.

With ``--data`` or ``--csv`` the data set picks its section (more than two classes: multiclass; more
than :data:`LARGE` rows: sparse; otherwise exact), unless ``--section`` or ``--methods`` name one.
Method names are unique across sections: the exact engine's "sep" is *sequential* EP, the sparse
estimator's EP is "sparse-ep".  Every fit runs with BLAS on ``--threads`` threads (default 1,
through threadpoolctl) and is timed in CPU seconds, so the figures do not depend on what else
the machine runs.
"""

import contextlib
import json
import os
import sys
import time
import warnings
from typing import NamedTuple

import numpy as np

from .. import datasets
from ..classifier import GaussianProcessClassifier
from .._validation import plain
from ..exceptions import ConvergenceWarning
from ..kernels import ConstantKernel, RBF
from ._common import _share_cores, standardise

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

SECTIONS = ("exact", "sparse", "multiclass")
#: the bundled set each section runs on when no --data / --csv is given
DEFAULT_DATA = {"exact": "crabs", "sparse": "banana", "multiclass": "glass"}
#: rows above which a binary set goes to the sparse section (an exact EP fit at n = 2000 takes ~25 s)
LARGE = 2000
#: what --quick changes: fewer folds, smaller sets, fewer inducing-point counts and epochs
QUICK = {"folds": 2, "subsample": {"sparse": 1200, "multiclass": 100}, "inducing": [8],
         "exact_rows": [200], "sparse_iter": 20}


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


def stratified_subset(y, size, seed):
    """Sorted indices of a seeded random subset of ``size`` rows with y's class proportions (all rows
    if there are no more): each class gives ⌊size · n_c / n⌋ rows, and the rows left over go to the
    classes with the largest remainders."""
    if size >= len(y):
        return np.arange(len(y))
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(y, return_counts=True)
    share = size * counts / len(y)
    take = np.floor(share).astype(int)
    take[np.argsort(take - share, kind="stable")[: size - take.sum()]] += 1
    return np.sort(np.concatenate([rng.choice(np.flatnonzero(y == c), size=k, replace=False)
                                   for c, k in zip(classes, take)]))


def holdout_split(X, y, test_fraction, seed):
    """A stratified held-out split, inputs standardised on the training part.

    Returns (X_train, y_train, X_test, y_test, train): ``train`` indexes the training rows in X.
    """
    parts = int(round(1.0 / test_fraction))
    classes, counts = np.unique(y, return_counts=True)
    if counts.min() < parts:
        raise ValueError(f"class {plain(classes[np.argmin(counts)])!r} has {counts.min()} rows, fewer than the "
                         f"{parts} a split with {parts - 1}/{parts} for training needs (is the label a "
                         "category?)")
    test = stratified_folds(y, parts, seed)[0]
    train = np.setdiff1d(np.arange(len(y)), test)
    X_tr, X_te = standardise(X[train], X[test])
    return X_tr, y[train], X_te, y[test], train


def default_kernel():
    return ConstantKernel(1.0, (1e-3, 1e4)) * RBF(1.0, (1e-2, 1e3))


def timed_fit(model, X, y):
    """Fit ``model``; a dict with its wall and CPU seconds and ConvergenceWarnings, or its failure."""
    start, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        try:
            model.fit(X, y)
        except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
            return {"failure": str(exc)}
    return {"fit_seconds": time.perf_counter() - start, "fit_cpu_seconds": time.process_time() - cpu,
            "warnings": sorted({str(w.message)[:120] for w in caught
                                if issubclass(w.category, ConvergenceWarning)})}


def held_out_scores(model, X_test, y_test):
    """Test error with its binomial standard error √(e(1 − e)/n), mean negative log predictive
    probability of the true label, and balanced accuracy (the mean over classes of the accuracy on
    that class's test rows; RMGPC §4.1's BCR)."""
    proba = model.predict_proba(X_test)
    classes = model.classes_
    col = np.searchsorted(classes, y_test)
    seen = (col < len(classes)) & (classes[np.minimum(col, len(classes) - 1)] == y_test)
    p_true = np.where(seen, proba[np.arange(len(y_test)), np.minimum(col, len(classes) - 1)], 0.0)
    pred = classes[np.argmax(proba, axis=1)]
    error = float(np.mean(pred != y_test))
    return {"error": error, "error_se": float(np.sqrt(error * (1.0 - error) / len(y_test))),
            "nll": float(-np.mean(np.log(np.clip(p_true, 1e-300, 1.0)))),
            "balanced_accuracy": float(np.mean([np.mean(pred[y_test == c] == c)
                                                for c in np.unique(y_test)]))}


@contextlib.contextmanager
def blas_threads(n):
    """BLAS on ``n`` threads while the block runs: the caller's limit, which the estimators'
    ``n_jobs=None`` takes as their threads (gpc._threads)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(n):
        yield


# -- the exact section --------------------------------------------------------------------------

def _fit_one(task):
    X_tr, y_tr, X_te, y_te, label, likelihood, seed = task
    method, schedule = METHOD_LABELS[label]
    X_tr, X_te = standardise(X_tr, X_te)
    clf = GaussianProcessClassifier(kernel=default_kernel(), likelihood=likelihood, method=method,
                                    schedule=schedule, random_state=seed)
    fit = timed_fit(clf, X_tr, y_tr)
    if "failure" in fit:
        return {"method": label, "likelihood": likelihood, "error": None, "failure": fit["failure"]}
    scores = held_out_scores(clf, X_te, y_te)
    return {"method": label, "likelihood": likelihood, "error": scores["error"], "nll": scores["nll"],
            "log_evidence": float(clf.log_marginal_likelihood_value_), **fit}


def say(options, line):
    """A progress line on stderr, flushed at once (``--quiet`` leaves it out); the tables go to stdout."""
    if options["progress"]:
        print(line, file=sys.stderr, flush=True)


def map_fits(fn, tasks, keys, jobs=1, done=None):
    """``fn`` over ``tasks``, in a process pool when ``jobs`` > 1; the results in task order.

    ``keys`` (one per task, each key's tasks next to each other) group the tasks into methods:
    ``done(key, results)`` is called as soon as a key's last task has finished, in key order, so
    that a long section reports each method as it completes.
    """
    left = {}
    for key in keys:
        left[key] = left.get(key, 0) + 1
    pool = None
    if jobs > 1 and len(tasks) > 1:
        from concurrent.futures import ProcessPoolExecutor
        pool = ProcessPoolExecutor(max_workers=jobs, initializer=_share_cores, initargs=(jobs,))
    results, group = [], []
    try:
        for key, result in zip(keys, pool.map(fn, tasks) if pool else map(fn, tasks)):
            results.append(result)
            group.append(result)
            left[key] -= 1
            if not left[key]:
                if done is not None:
                    done(key, group)
                group = []
    finally:
        if pool is not None:
            pool.shutdown()
    return results


def cpu_seconds(records):
    """The fits' CPU seconds, summed over the records that have them."""
    return sum(r.get("fit_cpu_seconds", 0.0) for r in records)


def fit_line(label, records):
    """One progress line for a method's finished fits: its label, test error and CPU time."""
    ok = [r for r in records if r.get("error") is not None]
    if not ok:
        return f"  {label}: failed"
    error = np.mean([r["error"] for r in ok])
    folds = f"{len(ok)} fits, " if len(records) > 1 else ""
    failed = f", {len(records) - len(ok)} failed" if len(ok) < len(records) else ""
    return f"  {label}: {folds}test error {error:.3f}, {cpu_seconds(ok):.1f} s CPU{failed}"


def run(X, y, labels, likelihoods, n_folds=5, seed=0, jobs=1, progress=None):
    """Cross-validate every (method label, likelihood) pair; returns one summary record per pair.

    ``progress``: the options of :func:`say`, or None for no progress lines."""
    folds = stratified_folds(y, n_folds, seed)
    tasks = []
    for label in labels:
        for lik in likelihoods:
            if label == "laplace" and lik in ("noisy_threshold", "heaviside"):
                continue  # Laplace needs a gradient (PL paper §I)
            for k, test in enumerate(folds):
                train = np.setdiff1d(np.arange(len(y)), test)
                tasks.append((X[train], y[train], X[test], y[test], label, lik, seed + k))
    keys = [(t[4], t[5]) for t in tasks]

    def done(key, results):
        if progress is not None:
            say(progress, fit_line(" ".join(key), results))

    results = map_fits(_fit_one, tasks, keys, jobs=jobs, done=done)
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
        rec = {"section": "exact", "method": key[0], "likelihood": key[1], "n_folds": n_folds,
               "n_failed": len(rs) - len(ok)}
        if ok:
            for field in ("error", "nll", "log_evidence", "fit_seconds", "fit_cpu_seconds"):
                vals = np.array([r[field] for r in ok])
                rec[f"{field}_mean"] = float(vals.mean())
                if field == "error":
                    rec["error_se"] = float(vals.std(ddof=1) / np.sqrt(len(vals))) if len(vals) > 1 else 0.0
        failures = sorted({r.get("failure", "") for r in rs if r["error"] is None})
        if failures:
            rec["failures"] = failures
        records.append(rec)
    return records


#: notes printed under the table for methods that are worse by nature, not by a failed fit
METHOD_NOTES = {
    "mf-naive": "naive mean field (MF eq. (8)-(9)) takes the prior variance K_jj for the cavity variance of "
                "f_j, ignoring what the other data say about it: a cruder posterior, and a free energy "
                "that is no bound (its evidence is not comparable)",
    "online": "one ADF pass (MF eq. (10)-(12)), not iterated to a fixed point, in a seeded random order "
              "(in file order, sorted by class, its evidence favoured a degenerate fit); its evidence is "
              "prequential and depends on that order",
}

EXACT_CAPTION = ("GaussianProcessClassifier, every approximation of the exact GP posterior on a small "
                 "binary set: lower test error and NLL are better; the evidence ranks θ fits of one method")


def format_table(records, title=""):
    head = (f"{'method':<12} {'likelihood':<16} {'test error':>16} {'test NLL':>9} {'log evidence':>13} "
            f"{'fit CPU s':>9}")
    lines = [title, head, "-" * len(head)] if title else [head, "-" * len(head)]
    for r in records:
        if "error_mean" not in r:
            lines.append(f"{r['method']:<12} {r['likelihood']:<16} failed: {'; '.join(r.get('failures', []))[:80]}")
            continue
        err = f"{r['error_mean']:.3f} ± {r['error_se']:.3f}"
        lines.append(f"{r['method']:<12} {r['likelihood']:<16} {err:>16} {r['nll_mean']:>9.3f} "
                     f"{r['log_evidence_mean']:>13.2f} {r['fit_cpu_seconds_mean']:>9.2f}"
                     + (f"  ({r['n_failed']} folds failed)" if r["n_failed"] else ""))
    shown = [m for m in METHOD_NOTES if any(r["method"] == m for r in records)]
    if shown:
        lines.append("")
        lines += [f"{m}: {METHOD_NOTES[m]}" for m in shown]
    return "\n".join(lines)


def run_exact(data, labels, options):
    """The exact section on ``data``: records and the printed table."""
    X, y, name = data.X, data.y, data.name
    folds = options["folds"]
    classes, counts = np.unique(y, return_counts=True)
    if counts.min() < folds:
        raise ValueError(f"{name}: class {plain(classes[np.argmin(counts)])!r} has {counts.min()} points, fewer "
                         f"than --folds {folds}")
    say(options, f"exact section: {name}, n = {len(y)}, {len(labels)} methods x {folds} folds")
    records = run(X, y, labels, options["likelihoods"], n_folds=folds, seed=options["seed"],
                  jobs=options["jobs"], progress=options)
    for r in records:
        r["dataset"] = name
    title = (f"{name}: n = {len(y)}, d = {X.shape[1]}, {folds}-fold CV, kernel σ² exp(−‖x−x'‖²/2ℓ²), "
             "type-II ML")
    return records, format_table(records, title=f"{EXACT_CAPTION}\n{title}")


# -- the held-out sections (sparse, multiclass) ------------------------------------------------

def held_out_table(records, title, balanced=False, notes=()):
    """The table of a held-out section: one line per fit, ``label`` first."""
    head = f"{'method':<22} {'test error':>15} " + (f"{'balanced acc':>12} " if balanced else "") + \
        f"{'test NLL':>9} {'fit CPU s':>9}"
    lines = [title, head, "-" * len(head)]
    for r in records:
        if r.get("error") is None:
            lines.append(f"{r['label']:<22} failed: {r.get('failure', '')[:80]}")
            continue
        err = f"{r['error']:.3f} ± {r['error_se']:.3f}"
        lines.append(f"{r['label']:<22} {err:>15} " + (f"{r['balanced_accuracy']:>12.3f} " if balanced else "")
                     + f"{r['nll']:>9.3f} {r['fit_cpu_seconds']:>9.2f}" + ("  *" if r.get("warnings") else ""))
    warned = [f"* {r['label']}: {'; '.join(r['warnings'])}" for r in records if r.get("warnings")]
    if notes or warned:
        lines.append("")
        lines += warned + list(notes)
    return "\n".join(lines)


def held_out_fit(model, X_fit, y_fit, X_test, y_test, record):
    """Fit ``model``, score it on the test rows and complete ``record`` (``error`` None on failure)."""
    fit = timed_fit(model, X_fit, y_fit)
    record.update(fit, n_train=len(y_fit), n_test=len(y_test))
    if "failure" in fit:
        record["error"] = None
        return record
    record.update(held_out_scores(model, X_test, y_test))
    return record


# -- the three sections -------------------------------------------------------------------------

LIKELIHOODS = ("probit", "logit", "noisy_threshold", "heaviside")


def section_methods():
    """{section: its method labels}; every label belongs to one section only."""
    from . import compare_multiclass, compare_sparse
    return {"exact": tuple(METHOD_LABELS), "sparse": tuple(compare_sparse.METHODS),
            "multiclass": tuple(compare_multiclass.METHODS)}


def _runner(section):
    from . import compare_multiclass, compare_sparse
    return {"exact": run_exact, "sparse": compare_sparse.run_section,
            "multiclass": compare_multiclass.run_section}[section]


def check_methods(labels):
    """Method labels -> the same list; ValueError naming any unknown label."""
    known = section_methods()
    everything = [m for names in known.values() for m in names]
    unknown = [m for m in labels if m not in everything]
    if unknown:
        listing = "; ".join(f"{s}: {', '.join(names)}" for s, names in known.items())
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; known: {listing}")
    return list(labels)


def methods_by_section(labels):
    """{section: the labels of ``labels`` in it}, sections in SECTIONS order, empty ones left out."""
    known = section_methods()
    return {s: [m for m in labels if m in known[s]] for s in SECTIONS if any(m in known[s] for m in labels)}


class Data(NamedTuple):
    """A section's data: inputs, labels, a name for the tables, and each row's 0-based index in
    the file it came from (kept through subsampling, so that rows can be named)."""
    X: np.ndarray
    y: np.ndarray
    name: str
    rows: np.ndarray
    bundled: str | None = None


def load_data(args, multiclass=False):
    """:class:`Data` from --csv/--label or --data, with errors a user can act on.

    ``multiclass`` loads a bundled set that has a binary grouping (glass, thyroid) with its
    original classes.
    """
    if args.csv:
        X, y = datasets.load_csv(args.csv, label=args.label, return_X_y=True)
        return Data(X, y, args.csv, np.arange(len(y)))
    name = args.data
    if name not in datasets.available():
        raise ValueError(f"unknown data set {name!r}; available: {', '.join(datasets.available())}")
    kwargs = {"binary": False} if multiclass and name in datasets.GROUPED else {}
    X, y = datasets.load(name, **kwargs, return_X_y=True)
    return Data(X, y, name, np.arange(len(y)), name)


def subsample(data, size, seed):
    """A seeded stratified subset of ``size`` rows (everything when the set is no larger)."""
    if not size or size >= len(data.y):
        return data
    keep = stratified_subset(data.y, size, seed)
    return Data(data.X[keep], data.y[keep], f"{data.name} (subsample {len(keep)})", data.rows[keep],
                data.bundled)


def route(y, requested, labels):
    """The sections to run on a user's data set, and a line saying why when the data chose.

    ``requested``: the --section list or None; ``labels``: the --methods list or None.
    """
    if requested:
        return list(requested), None
    if labels:
        return list(methods_by_section(labels)), None
    n, n_classes = len(y), len(np.unique(y))
    flag = "(--section exact|sparse|multiclass chooses another)"
    if n > LARGE:
        why = f"{n} rows > {LARGE}: the sparse section, exact methods cost O(n³)"
        if n_classes > 2:
            why += (f"; its {n_classes} classes one-vs-rest (the multi-class models cost O(n³) per class; "
                    "--section multiclass runs them)")
        return ["sparse"], f"{why} {flag}"
    if n_classes > 2:
        return ["multiclass"], f"{n_classes} classes: the multiclass section {flag}"
    return ["exact"], None


def _options(args):
    quick = bool(getattr(args, "quick", False))
    folds = args.folds if args.folds is not None else (QUICK["folds"] if quick else 5)
    if folds < 2:
        raise ValueError("--folds must be at least 2")
    if args.jobs < 1:
        raise ValueError("--jobs must be at least 1")
    if args.threads < 1:
        raise ValueError("--threads must be at least 1")
    likelihoods = args.likelihood or ["probit"]
    bad = [lik for lik in likelihoods if lik not in LIKELIHOODS]
    if bad:
        raise ValueError(f"unknown likelihood(s) {', '.join(bad)}; choose from {', '.join(LIKELIHOODS)}")
    inducing = args.inducing or (QUICK["inducing"] if quick else [8, 32])
    exact_rows = args.exact_rows or (QUICK["exact_rows"] if quick else [500, 1000])
    sparse_iter = args.sparse_iter if args.sparse_iter is not None else (QUICK["sparse_iter"] if quick else 100)
    for flag, values in (("--inducing", inducing), ("--exact-rows", exact_rows), ("--sparse-iter", [sparse_iter])):
        if min(values) < 1:
            raise ValueError(f"{flag} must be at least 1")
    return {"folds": folds, "likelihoods": likelihoods, "seed": args.seed, "jobs": args.jobs,
            "progress": not args.quiet, "inducing": inducing, "exact_rows": exact_rows,
            "sparse_iter": sparse_iter}


def plan(args, labels):
    """[(section, Data, method labels, note)] in SECTIONS order."""
    by_section = methods_by_section(labels) if labels else section_methods()
    requested = args.section
    if requested and labels:
        for s in requested:
            if s not in by_section:
                raise ValueError(f"--section {s} has none of the methods {', '.join(labels)}; its methods: "
                                 f"{', '.join(section_methods()[s])}")
        stray = [m for m in labels if not any(m in by_section.get(s, ()) for s in requested)]
        if stray:
            raise ValueError(f"method(s) {', '.join(stray)} are not in --section {' '.join(requested)}")
    quick = bool(getattr(args, "quick", False))
    steps = []
    if args.data or args.csv:
        data = subsample(load_data(args), args.subsample, args.seed)
        sections, note = route(data.y, requested, labels)
        for s in SECTIONS:
            if s not in sections:
                continue
            own = data
            if s == "multiclass" and not args.csv and args.data in datasets.GROUPED:
                own = subsample(load_data(args, multiclass=True), args.subsample, args.seed)
            steps.append((s, own, by_section.get(s) or list(section_methods()[s]), note))
        return steps
    for s in SECTIONS:
        if s not in by_section or (requested and s not in requested):
            continue
        name = DEFAULT_DATA[s]
        X, y = datasets.load(name, **({"binary": False} if s == "multiclass" else {}), return_X_y=True)
        size = args.subsample or (QUICK["subsample"].get(s) if quick else None)
        steps.append((s, subsample(Data(X, y, name, np.arange(len(y)), name), size, args.seed),
                      by_section[s], None))
    return steps


def point(record):
    """(label, fit CPU seconds, test error, test NLL) of a record, or None for a failed fit."""
    section = record.get("section", "exact")
    if section == "exact":
        if "error_mean" not in record:
            return None
        label = record["method"] if record["likelihood"] == "probit" else f"{record['method']} {record['likelihood']}"
        return label, record["fit_cpu_seconds_mean"], record["error_mean"], record["nll_mean"]
    if record.get("error") is None:
        return None
    return record["label"], record["fit_cpu_seconds"], record["error"], record["nll"]


def main(args):
    labels = check_methods(args.methods) if args.methods else None
    options = _options(args)
    steps = plan(args, labels)
    if not steps:
        raise ValueError("nothing to run: no section has the methods asked for")
    for _, data, _, _ in steps:
        classes = np.unique(data.y)
        if len(classes) < 2:
            raise ValueError(f"{data.name} has one class only ({plain(classes[0])!r})")
    records, tables = [], []
    with blas_threads(args.threads):
        for section, data, section_labels, note in steps:
            recs, table = _runner(section)(data, section_labels, options)
            records += recs
            heading = f"== {section} =="
            tables.append("\n".join([heading] + ([note] if note else []) + [table]))
    print("\n\n".join(tables))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(records, fh, indent=2)
        print("wrote", args.out)
    if args.plot:
        from .plots import plot_compare
        print("wrote", plot_compare(records, args.plot))
    return records
