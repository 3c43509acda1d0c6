"""``gpc reproduce sep-banana``: SEP paper, Figure 2 (inducing points and decision boundaries).

Protocol (SEP §4.2, "using the setting of the previous section"): the two-dimensional Banana set;
GFITC, SEP and SVI with m = 4, 8, 16, 32, 64, 128, 256 inducing points started at random training
rows (the same for every method), ARD squared exponential + amplitude + noise, probit, 250 batch
iterations.  The paper does not say how many Banana rows it trained on; we use 400 seeded rows, the
size of Rätsch's benchmark training partitions, so m = 256 is still sparse, and score a further
1000 seeded rows as a test set.  Inputs are standardised with the training rows' mean and s.d.; the
figure is drawn in the original coordinates.
"""

import numpy as np

from .. import datasets
from ._common import check_names, count_convergence_warnings, map_tasks
from .sep_common import (add_doc_arguments, make_classifier, markdown_table, predictive_scores,
                         publish_doc_tables, random_rows, read_records, train)

M_VALUES = (4, 8, 16, 32, 64, 128, 256)
METHOD_ORDER = ("sep", "svi", "gfitc")      # the paper's rows, top to bottom
N_TRAIN, N_TEST = 400, 1000
ITERATIONS = 250
GRID = 80                                   # decision-boundary grid points per axis


def load_split(seed):
    """(X_train, y_train, X_test, y_test): 400 and 1000 disjoint seeded rows of Banana."""
    X, y = datasets.load_banana(return_X_y=True)
    perm = np.random.default_rng(seed).permutation(len(y))
    tr, te = perm[:N_TRAIN], perm[N_TRAIN:N_TRAIN + N_TEST]
    return X[tr], np.where(y[tr] > 0, 1.0, -1.0), X[te], np.where(y[te] > 0, 1.0, -1.0)


def grid_box(X):
    """The plotted window: the data's range with a 5 % margin, as (x0, x1, y0, y1)."""
    lo, hi = X.min(axis=0), X.max(axis=0)
    pad = 0.05 * (hi - lo)
    return float(lo[0] - pad[0]), float(hi[0] + pad[0]), float(lo[1] - pad[1]), float(hi[1] + pad[1])


def _fit(task):
    X_tr, y_tr, X_te, y_te, method, m, iterations, seed, box = task
    mu, sd = X_tr.mean(axis=0), X_tr.std(axis=0)
    Xs = (X_tr - mu) / sd
    Z = Xs[random_rows(len(Xs), min(m, len(Xs)), seed)]
    clf = make_classifier(method, Z, iterations, seed)
    with count_convergence_warnings():
        try:
            clf, seconds, wall, stopped = train(method, clf, Xs, y_tr, iterations)
        except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
            return {"method": method, "m": m, "failure": f"{type(exc).__name__}: {exc}"[:200]}
    pos = list(clf.classes_).index(1)
    error, nll = predictive_scores(clf.predict_proba((X_te - mu) / sd)[:, pos], y_te)
    gx, gy = np.linspace(box[0], box[1], GRID), np.linspace(box[2], box[3], GRID)
    G = np.column_stack([np.repeat(gx, GRID), np.tile(gy, GRID)])
    proba = clf.predict_proba((G - mu) / sd)[:, pos].reshape(GRID, GRID).T   # rows: y, cols: x
    return {"method": method, "m": m, "test_error": error, "test_nll": nll, "seconds": seconds,
            "wall": wall,
            "inducing_points": clf.inducing_points_ * sd + mu,
            "initial_inducing_points": Z * sd + mu, "grid_proba": proba, "grid_box": list(box),
            "reverted": clf.history_[-1]["reverted"] if clf.history_ else 0, "stopped": stopped}


def run(m_values=M_VALUES, methods=METHOD_ORDER, iterations=ITERATIONS, seed=0, jobs=1, progress=True):
    """One record per (method, m): test error and NLL on the 1000 held-out rows, fit seconds (CPU;
    ``wall`` the wall time), the initial and learnt inducing points and P(y = +1) on a GRID x GRID
    grid over ``grid_box``, all in the original coordinates (the training rows:
    :func:`load_split` with the same seed)."""
    check_names(methods, METHOD_ORDER, "method", "sep-banana")
    for m in m_values:
        if not 1 <= m <= N_TRAIN:
            raise ValueError(f"m must be in 1..{N_TRAIN}, got {m}")
    X_tr, y_tr, X_te, y_te = load_split(seed)
    box = grid_box(X_tr)
    # largest m first: the slow fits start early and the pool's tail is short
    tasks = [(X_tr, y_tr, X_te, y_te, meth, m, iterations, seed, box)
             for m in sorted(m_values, reverse=True) for meth in methods]
    results = map_tasks(_fit, tasks, jobs=jobs, desc="sep-banana fits", show=progress)
    order = {(meth, m): k for k, (meth, m) in enumerate((a, b) for a in methods for b in m_values)}
    return sorted(results, key=lambda r: order[(r["method"], r["m"])])


def format_table(records):
    lines = ["SEP Figure 2 (Banana, 400 training rows): test error / NLL on 1000 rows, fit seconds",
             f"{'method':<8}{'m':>5}{'error':>8}{'NLL':>8}{'seconds':>9}"]
    for r in records:
        if "failure" in r:
            lines.append(f"{r['method']:<8}{r['m']:>5}  failed: {r['failure']}")
        else:
            lines.append(f"{r['method']:<8}{r['m']:>5}{r['test_error']:>8.3f}{r['test_nll']:>8.3f}"
                         f"{r['seconds']:>9.1f}")
    return "\n".join(lines)


def doc_tables(records):
    """The markdown table of docs/reproduction.md, ``sep-banana``: one row per method, one column
    per m, each cell test error / NLL (training CPU seconds)."""
    methods = [m for m in METHOD_ORDER if any(r["method"] == m for r in records)]
    ms = sorted({r["m"] for r in records})
    get = {(r["method"], r["m"]): r for r in records}
    rows = []
    for meth in methods:
        row = [f"{meth.upper()} error / NLL (s)"]
        for m in ms:
            r = get.get((meth, m))
            if r is None or "failure" in r:
                row.append("failed" if r else "")
            else:
                seconds = f"{r['seconds']:.1f}" if r["seconds"] < 10 else f"{r['seconds']:.0f}"
                row.append(f"{r['test_error']:.3f} / {r['test_nll']:.3f} ({seconds})")
        rows.append(row)
    return {"sep-banana": markdown_table(["m"] + [str(m) for m in ms], rows)}


def add_arguments(parser):
    parser.add_argument("--m-values", nargs="+", type=int, default=list(M_VALUES), metavar="M",
                        help="numbers of inducing points (default 4 8 16 32 64 128 256)")
    parser.add_argument("--iterations", type=int, default=ITERATIONS,
                        help="batch iterations of every method (default 250)")
    add_doc_arguments(parser)


def main(args):
    if args.folds is not None or args.datasets:
        raise ValueError("sep-banana has one data set and no folds")
    if args.from_json:
        records = read_records(args.from_json)
        print(format_table(records))
        publish_doc_tables(args, doc_tables(records))
        return records
    if args.iterations < 1:
        raise ValueError("--iterations must be at least 1")
    records = run(args.m_values, args.methods or METHOD_ORDER, args.iterations, args.seed, args.jobs,
                  not args.quiet)
    print(format_table(records))
    if args.plots:
        from .sep_plots import plot_sep_banana
        X_tr, y_tr, _, _ = load_split(args.seed)
        print("wrote", plot_sep_banana(records, X_tr, y_tr, args.plots))
    # the grids are for the figure; the JSON keeps the numbers and the inducing points
    records = [{k: v for k, v in r.items() if k != "grid_proba"} for r in records]
    if args.update_doc:
        publish_doc_tables(args, doc_tables(records))
    return records
