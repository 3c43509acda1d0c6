"""``gpc reproduce sep-table1``: SEP paper, Table 1 (test NLL and training time of GFITC, SEP, SVI).

Protocol (SEP §4.1):
* seven UCI sets; 20 random 90 % / 10 % train/test splits (seeded; the paper's splits are not
  published); inputs standardised with the training part's mean and s.d.;
* m = 15, 25 and 50 % of the n rows as inducing points, started at random training rows, the same
  for every method (see :mod:`.sep_common` for the common kernel start);
* ARD squared exponential + amplitude + additive noise, probit likelihood;
* 250 batch iterations: epochs of SEP's Adadelta steps, objective evaluations of GFITC's and SVI's
  L-BFGS-B (the estimator's ``max_iter``);
* reported: mean ± s.d. of the test negative log-likelihood over the splits, mean training time.

Pima is the 768-row UCI file (``split="full"``: its zeros, which mean "missing", are kept as the
source has them); breast is Wisconsin with the 16 missing cells imputed (the loader's default);
ionosphere drops its constant column.
"""

import numpy as np

from .. import datasets
from ._common import check_names, count_convergence_warnings, map_cells, standardise
from .sep_common import (add_doc_arguments, make_classifier, markdown_table,
                         predictive_scores, publish_doc_tables, random_rows, read_records, train,
                         trivial_nll)

DATASETS = ("australian", "breast", "crabs", "heart", "ionosphere", "pima", "sonar")
LOADER_ARGS = {"australian": ("australian", {}), "breast": ("breast_cancer", {}),
               "crabs": ("crabs", {}), "heart": ("heart", {}),
               "ionosphere": ("ionosphere", {"drop_constant": True}),
               "pima": ("pima", {"split": "full"}), "sonar": ("sonar", {})}
M_FRACTIONS = (0.15, 0.25, 0.50)
METHOD_ORDER = ("gfitc", "sep", "svi")
N_SPLITS = 20
ITERATIONS = 250
TEST_FRACTION = 0.1

#: SEP paper, Table 1, typed from the paper's text: (mean, s.d.) of the test NLL per data set, m
#: fraction and method
PAPER = {
    "australian": {0.15: ((.68, .06), (.69, .07), (.63, .05)), 0.25: ((.68, .08), (.67, .07), (.63, .05)),
                   0.50: ((.67, .09), (.64, .05), (.63, .05))},
    "breast": {0.15: ((.10, .05), (.11, .05), (.10, .05)), 0.25: ((.11, .06), (.11, .05), (.10, .05)),
               0.50: ((.11, .05), (.11, .05), (.10, .05))},
    "crabs": {0.15: ((.07, .07), (.06, .06), (.07, .06)), 0.25: ((.06, .07), (.06, .06), (.07, .07)),
              0.50: ((.06, .07), (.06, .06), (.09, .06))},
    "heart": {0.15: ((.43, .12), (.40, .13), (.39, .11)), 0.25: ((.42, .12), (.41, .12), (.40, .11)),
              0.50: ((.42, .13), (.41, .11), (.40, .10))},
    "ionosphere": {0.15: ((.30, .22), (.26, .19), (.26, .14)), 0.25: ((.29, .23), (.27, .20), (.27, .18)),
                   0.50: ((.30, .24), (.27, .19), (.26, .16))},
    "pima": {0.15: ((.54, .08), (.52, .07), (.49, .05)), 0.25: ((.53, .07), (.51, .06), (.50, .05)),
             0.50: ((.53, .07), (.50, .05), (.49, .05))},
    "sonar": {0.15: ((.35, .13), (.33, .10), (.40, .17)), 0.25: ((.35, .12), (.32, .10), (.40, .19)),
              0.50: ((.35, .13), (.29, .09), (.35, .16))},
}
#: the paper's "Avg. Time" row, seconds (mean, s.d.) per m fraction and method (the paper's R code)
PAPER_TIME = {0.15: ((59, 4), (17, 1), (40, 2)), 0.25: ((133, 6), (37, 2), (65, 3)),
              0.50: ((494, 29), (130, 5), (195, 10))}


def paper_cell(dataset, m_fraction, method):
    """The paper's (mean, s.d.) test NLL of one cell."""
    return PAPER[dataset][m_fraction][METHOD_ORDER.index(method)]


def load(name):
    """X and ±1 labels of one Table 1 data set."""
    if name not in LOADER_ARGS:
        raise ValueError(f"unknown data set {name!r} for sep-table1; choose from {', '.join(DATASETS)}")
    loader, kwargs = LOADER_ARGS[name]
    ds = datasets.load(loader, **kwargs)
    return np.asarray(ds.X, dtype=float), ds.y_pm1()


def split(n, seed, k):
    """(train, test) indices of random split k: a seeded permutation, the first 10 % for testing."""
    perm = np.random.default_rng([seed, k]).permutation(n)
    n_test = max(1, int(round(TEST_FRACTION * n)))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _fit_split(task):
    X_tr, y_tr, X_te, y_te, method, m, iterations, seed = task
    X_tr, X_te = standardise(X_tr, X_te)
    Z = X_tr[random_rows(len(X_tr), m, seed)]
    clf = make_classifier(method, Z, iterations, seed)
    with count_convergence_warnings() as caught:
        try:
            clf, seconds, wall, stopped = train(method, clf, X_tr, y_tr, iterations)
            proba = clf.predict_proba(X_te)[:, list(clf.classes_).index(1)]
        except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
            return {"nll": None, "failure": f"{type(exc).__name__}: {exc}"[:200]}
    error, nll = predictive_scores(proba, y_te)
    state = clf._problems[0][0].state
    return {"nll": nll, "error": error, "seconds": seconds, "wall": wall,
            "trivial_nll": trivial_nll(y_tr, y_te), "n_iter": clf.n_iter_, "stopped": stopped,
            "reverted": clf.history_[-1]["reverted"] if clf.history_ else 0,
            "ep_passes": getattr(state, "passes", None), "n_warnings": len(caught)}


def split_tasks(table, data, n_splits, iterations, seed):
    """(tasks, keys): for every (data set, m fraction, method) cell of ``table`` and split k of
    :func:`split`, the task (X_train, y_train, X_test, y_test, method, m = the fraction of the
    training rows (at least 1), iterations, seed + k), keyed by its cell; ``data`` maps a data set
    to (X, y)."""
    tasks, keys = [], []
    for d, f, meth in table:
        X, y = data[d]
        for k in range(n_splits):
            train, test = split(len(y), seed, k)
            m = max(1, int(round(f * len(train))))
            tasks.append((X[train], y[train], X[test], y[test], meth, m, iterations, seed + k))
            keys.append((d, f, meth))
    return tasks, keys


def task_cost(n, m, method):
    """A rough relative cost of one fit, n m² per iteration (GFITC's EP passes counted twice),
    to start the longest fits first so that the pool's last fits are short ones."""
    return n * (m * m + 100.0 * m) * (2.0 if method == "gfitc" else 1.0)


def cells(dataset_names, m_fractions, methods):
    return [(d, f, meth) for d in dataset_names for f in m_fractions for meth in methods]


def _sd(values):
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def _mean(values):
    return float(np.mean(values)) if len(values) else None


def run(dataset_names=DATASETS, m_fractions=M_FRACTIONS, methods=METHOD_ORDER, n_splits=N_SPLITS,
        iterations=ITERATIONS, seed=0, jobs=1, progress=True):
    """Run the table; one record per (dataset, m fraction, method).

    Records: dataset, method, m_fraction, nll_mean, nll_sd, error_mean, time_mean (training CPU
    seconds, :func:`.sep_common.timed_fit`), n_splits (splits that ran), plus m, time_sd,
    wall_mean (wall seconds), nll_splits (each split's NLL), trivial_nll (the constant predictor's
    NLL on the same splits), paper_nll, paper_sd, within_paper_sd, n_failed, failures, n_stopped
    (SEP fits the divergence guard of :func:`.sep_common.fit_with_divergence_guard` stopped
    early), mean_iterations and, for GFITC, ep_passes_per_evaluation.  Fits run longest first
    (:func:`task_cost`); the records do not depend on the order or on ``jobs``.
    """
    check_names(methods, METHOD_ORDER, "method", "sep-table1")
    for f in m_fractions:
        if f not in M_FRACTIONS:
            raise ValueError(f"m fraction {f} is not one of the paper's {M_FRACTIONS}")
    if n_splits < 1 or iterations < 1:
        raise ValueError("--splits and --iterations must be at least 1")
    data = {d: load(d) for d in dataset_names}
    table = cells(dataset_names, m_fractions, methods)
    tasks, keys = split_tasks(table, data, n_splits, iterations, seed)
    grouped = map_cells(_fit_split, tasks, keys, jobs=jobs, desc="sep-table1 fits", show=progress,
                        cost=lambda t: task_cost(len(t[1]), t[5], t[4]))
    records = []
    for cell in table:
        rs = grouped[cell]
        ok = [r for r in rs if r["nll"] is not None]
        d, f, meth = cell
        nll = [r["nll"] for r in ok]
        paper_mean, paper_sd = paper_cell(d, f, meth)
        rec = {"dataset": d, "method": meth, "m_fraction": f,
               "m": int(round(f * len(split(len(data[d][1]), seed, 0)[0]))),
               "nll_mean": _mean(nll), "nll_sd": _sd(nll),
               "error_mean": _mean([r["error"] for r in ok]),
               "time_mean": _mean([r["seconds"] for r in ok]),
               "time_sd": _sd([r["seconds"] for r in ok]),
               "wall_mean": _mean([r["wall"] for r in ok]), "n_splits": len(ok),
               "trivial_nll": _mean([r["trivial_nll"] for r in ok]),
               "reverted": int(sum(r["reverted"] for r in ok)),
               "n_stopped": sum(r["stopped"] is not None for r in ok),
               "mean_iterations": _mean([r["n_iter"] for r in ok]),
               "n_convergence_warnings": int(sum(r["n_warnings"] for r in ok)),
               "paper_nll": paper_mean, "paper_sd": paper_sd,
               "within_paper_sd": bool(ok) and abs(float(np.mean(nll)) - paper_mean) <= paper_sd,
               "n_failed": len(rs) - len(ok), "nll_splits": nll}
        if meth == "gfitc" and ok:
            rec["ep_passes_per_evaluation"] = float(sum(r["ep_passes"] for r in ok)
                                                    / sum(r["n_iter"] for r in ok))
        if len(rs) != len(ok):
            rec["failures"] = sorted({r["failure"] for r in rs if r["nll"] is None})
        records.append(rec)
    return records


def format_table(records):
    """Rows data sets, columns m fraction × method: 'ours ± sd (paper ± sd)', a '!' where our mean
    is outside the paper's ± s.d.; last row the mean training time."""
    fracs = [f for f in M_FRACTIONS if any(r["m_fraction"] == f for r in records)]
    methods = [m for m in METHOD_ORDER if any(r["method"] == m for r in records)]
    dsets = [d for d in DATASETS if any(r["dataset"] == d for r in records)]
    cols = [(f, m) for f in fracs for m in methods]
    head = f"{'':<11}" + "".join(f"{f'{m} {int(100 * f)}%':>24}" for f, m in cols)
    lines = ["SEP Table 1: test NLL, ours mean ± sd (paper), ! = outside the paper's ± sd", head,
             "-" * len(head)]
    get = {(r["dataset"], r["m_fraction"], r["method"]): r for r in records}
    for d in dsets:
        row = f"{d[:10]:<11}"
        for f, m in cols:
            r = get.get((d, f, m))
            if r is None or not r["n_splits"]:
                row += f"{'failed':>24}"
                continue
            flag = " " if r["within_paper_sd"] else "!"
            row += f"{r['nll_mean']:.2f}±{r['nll_sd']:.2f}{flag}({r['paper_nll']:.2f}±{r['paper_sd']:.2f})".rjust(24)
        lines.append(row)
    row = f"{'time [s]':<11}"
    for f, m in cols:
        ts = [get[(d, f, m)]["time_mean"] for d in dsets if get.get((d, f, m), {}).get("time_mean")]
        paper = PAPER_TIME[f][METHOD_ORDER.index(m)][0]
        row += (f"{np.mean(ts):.1f} ({paper})" if ts else "-").rjust(24)
    lines.append(row)
    if any(r["n_failed"] for r in records):
        lines.append("some splits failed (see 'failures' in the JSON)")
    return "\n".join(lines)


def doc_tables(records):
    """The markdown tables of docs/reproduction.md: ``sep-table1:nll`` (ours mean ± s.d. with the
    paper's in brackets, bold outside the paper's ± s.d.; last row the mean training CPU seconds
    per fit and the paper's Avg. Time) and ``sep-table1:error`` (mean test error; splits that
    failed or that the guard stopped are counted in the cell)."""
    get = {(r["dataset"], r["m_fraction"], r["method"]): r for r in records}
    fracs = [f for f in M_FRACTIONS if any(r["m_fraction"] == f for r in records)]
    methods = [m for m in METHOD_ORDER if any(r["method"] == m for r in records)]
    dsets = [d for d in DATASETS if any(r["dataset"] == d for r in records)]
    cols = [(f, m) for f in fracs for m in methods]
    header = ["data set"] + [f"{m.upper()} {int(round(100 * f))}%" for f, m in cols]
    nll_rows, error_rows = [], []
    for d in dsets:
        nll_row, error_row = [d], [d]
        for f, m in cols:
            r = get.get((d, f, m))
            if r is None or not r["n_splits"]:
                nll_row.append("failed" if r else "")
                error_row.append("failed" if r else "")
                continue
            cell = (f"{r['nll_mean']:.2f} ± {r['nll_sd']:.2f} "
                    f"({r['paper_nll']:.2f} ± {r['paper_sd']:.2f})")
            nll_row.append(cell if r["within_paper_sd"] else f"**{cell}**")
            notes = ([f"{r['n_splits']} of {r['n_splits'] + r['n_failed']} splits"]
                     if r["n_failed"] else [])
            notes += [f"{r['n_stopped']} stopped"] if r.get("n_stopped") else []
            error_row.append(f"{r['error_mean']:.3f}" + (f" ({', '.join(notes)})" if notes else ""))
        nll_rows.append(nll_row)
        error_rows.append(error_row)
    time_row = ["mean CPU time [s]"]
    for f, m in cols:
        ts = [get[(d, f, m)]["time_mean"] for d in dsets
              if (d, f, m) in get and get[(d, f, m)]["time_mean"] is not None]
        mean, sd = PAPER_TIME[f][METHOD_ORDER.index(m)]
        time_row.append((f"{np.mean(ts):.1f}" if ts else "-") + f" ({mean} ± {sd})")
    nll_rows.append(time_row)
    return {"sep-table1:nll": markdown_table(header, nll_rows),
            "sep-table1:error": markdown_table(header, error_rows)}


def add_arguments(parser):
    parser.add_argument("--splits", type=int, default=N_SPLITS, help="random 90/10 splits (default 20)")
    parser.add_argument("--iterations", type=int, default=ITERATIONS,
                        help="batch iterations of every method (default 250)")
    parser.add_argument("--m-fractions", nargs="+", type=float, default=list(M_FRACTIONS),
                        metavar="F", help="inducing points as fractions of n (default 0.15 0.25 0.5)")
    add_doc_arguments(parser)


def main(args):
    if args.folds is not None:
        raise ValueError("sep-table1 uses random 90/10 splits, not folds: pass --splits")
    if args.from_json:
        records = read_records(args.from_json)
    else:
        names = args.datasets or list(DATASETS)
        for d in names:
            if d not in DATASETS:
                raise ValueError(f"unknown data set {d!r} for sep-table1; choose from "
                                 f"{', '.join(DATASETS)}")
        records = run(names, args.m_fractions, args.methods or METHOD_ORDER, n_splits=args.splits,
                      iterations=args.iterations, seed=args.seed, jobs=args.jobs,
                      progress=not args.quiet)
    print(format_table(records))
    if args.plots:
        from .sep_plots import plot_sep_table1
        print("wrote", plot_sep_table1(records, args.plots, DATASETS, PAPER))
    if args.from_json or args.update_doc:
        publish_doc_tables(args, doc_tables(records))
    return records
