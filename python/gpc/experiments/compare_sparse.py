"""The sparse section of ``gpc compare``: inducing-point classifiers on a set too large for exact ones.

One stratified held-out split (1/4 of the rows for testing; inputs standardised on the training
part).  ``SparseGaussianProcessClassifier`` fits every training row with m inducing points, at each m
of ``--inducing``: method "ep" (the SEP paper's scalable EP, shown as "sparse-ep": "sep" is the exact
engine's *sequential* EP), "gfitc" and "svi", each with the estimator's defaults (k-means Z, median
heuristic length scale, θ and Z learnt; ``--sparse-iter`` epochs or objective evaluations).  Exact
parallel EP (``GaussianProcessClassifier``, type-II ML, the exact section's kernel) fits stratified
subsets of the training rows, of each size in ``--exact-rows``: its cost grows as n³ (about 25 s of
CPU at n = 2000 on banana), so it sees fewer rows in the same time.
"""

from ..classifier import GaussianProcessClassifier
from ..sparse import SparseGaussianProcessClassifier
from .compare import (default_kernel, fit_line, held_out_fit, held_out_table, holdout_split, map_fits, say,
                      stratified_subset)

#: method labels -> SparseGaussianProcessClassifier's method (None: exact EP on a subset)
METHODS = {"exact-ep": None, "sparse-ep": "ep", "gfitc": "gfitc", "svi": "svi"}
TEST_FRACTION = 0.25
#: the likelihoods the sparse estimator takes by name
SPARSE_LIKELIHOODS = ("probit", "logit", "noisy_threshold")

CAPTION = ("SparseGaussianProcessClassifier on a set too large for exact methods: m inducing points on every "
           "training row (O(n m²)) against exact EP on n of them (O(n³)); lower test error and NLL are better")


def _fit_one(task):
    X_tr, y_tr, X_te, y_te, label, likelihood, size, seed, max_iter = task
    record = {"section": "sparse", "method": label, "likelihood": likelihood}
    if METHODS[label] is None:
        rows = stratified_subset(y_tr, size, seed)
        model = GaussianProcessClassifier(kernel=default_kernel(), likelihood=likelihood, method="ep",
                                          schedule="parallel", random_state=seed)
        record.update(label=f"exact-ep n={len(rows)}", n_inducing=None)
        X_fit, y_fit = X_tr[rows], y_tr[rows]
    else:
        model = SparseGaussianProcessClassifier(n_inducing=size, method=METHODS[label],
                                                likelihood=likelihood, max_iter=max_iter,
                                                random_state=seed, progress=False)
        record.update(label=f"{label} m={min(size, len(y_tr))}", n_inducing=min(size, len(y_tr)))
        X_fit, y_fit = X_tr, y_tr
    if likelihood != "probit":
        record["label"] += f" {likelihood}"
    return held_out_fit(model, X_fit, y_fit, X_te, y_te, record)


def tasks(data, labels, options):
    """One fit per (likelihood, method, size): exact EP at each --exact-rows, the rest at each m."""
    X_tr, y_tr, X_te, y_te, _ = holdout_split(data.X, data.y, TEST_FRACTION, options["seed"])
    out = []
    for lik in options["likelihoods"]:
        for label in labels:
            if METHODS[label] is None:
                sizes = sorted({min(n, len(y_tr)) for n in options["exact_rows"]})
            elif lik in SPARSE_LIKELIHOODS:
                sizes = sorted(set(options["inducing"]))
            else:
                continue   # the sparse estimator's likelihoods are probit, logit and noisy threshold
            out += [(X_tr, y_tr, X_te, y_te, label, lik, size, options["seed"], options["sparse_iter"])
                    for size in sizes]
    return out, len(y_tr), len(y_te)


def run_section(data, labels, options):
    """The sparse section on ``data``: records and the printed table."""
    work, n_train, n_test = tasks(data, labels, options)
    if not work:
        raise ValueError(f"the sparse section has nothing to fit: its estimator takes the likelihoods "
                         f"{', '.join(SPARSE_LIKELIHOODS)}")
    say(options, f"sparse section: {data.name}, {n_train} training rows, {len(work)} fits")
    records = map_fits(_fit_one, work, list(range(len(work))), jobs=options["jobs"],
                       done=lambda _, rs: say(options, fit_line(rs[0]["label"], rs)))
    for r in records:
        r["dataset"] = data.name
    title = (f"{data.name}: {n_train} training / {n_test} test rows (stratified), d = {data.X.shape[1]}, "
             f"{options['sparse_iter']} epochs (GFITC, SVI: objective evaluations)")
    notes = ["sparse-ep is the SEP paper's scalable EP (SparseGaussianProcessClassifier(method='ep')); "
             "'sep' is the exact engine's sequential EP"] if "sparse-ep" in labels else []
    return records, held_out_table(records, f"{CAPTION}\n{title}", notes=notes)
