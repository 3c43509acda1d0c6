"""``gpc reproduce sep-image``: SEP paper, Figure 3 left (test error and NLL against training time).

Protocol (SEP §4.3): the Image set, GFITC, SEP and SVI with m = 4, 50 and 200 inducing points,
"training is done as in Section 4.1" (random 90/10 splits, ARD squared exponential + amplitude +
noise, random initial inducing points shared by the methods, 250 batch iterations), and the test
error and NLL are followed along the training time, averaged over 100 realisations.

The paper's Image is Rätsch's binary benchmark, whose grouping is not shipped; the bundled set is
the 7-class Statlog image segmentation (2310 rows, 330 per class).  Our binary split, fixed here:
**outdoor scenery** (sky, foliage, grass: classes 2, 3, 7; 990 rows, +1) against **man-made or
ground** (brickface, cement, window, path: classes 1, 4, 5, 6; 1320 rows, -1).  The constant
column region-pixel-count is dropped (18 features, as in Rätsch's set).

The curves come from the estimator's ``history_`` with the test split as ``validation_data``: one
point per iteration (an epoch of SEP, an L-BFGS-B evaluation of GFITC and SVI), its time the wall
time since the fit started (which includes scoring the 231 test rows at earlier iterations, a few
per cent of an iteration).  Curves are averaged over the realisations iteration by iteration.
"""

import numpy as np

from .. import datasets
from ._common import check_names, count_convergence_warnings, map_cells, standardise
from .sep_common import (add_doc_arguments, make_classifier, markdown_table, publish_doc_tables,
                         random_rows, read_records, train)
from .sep_table1 import split

M_VALUES = (4, 50, 200)
METHOD_ORDER = ("gfitc", "sep", "svi")
POSITIVE_CLASSES = (2, 3, 7)          # sky, foliage, grass
ITERATIONS = 250
N_SPLITS = 100


def load():
    """X (2310 x 18) and ±1 labels of the binary image set described in the module docstring."""
    ds = datasets.load_image_segment()
    keep = [j for j, name in enumerate(ds.feature_names) if name != "region-pixel-count"]
    y = np.where(np.isin(np.asarray(ds.y), POSITIVE_CLASSES), 1.0, -1.0)
    return np.ascontiguousarray(ds.X[:, keep]), y


def _fit(task):
    X_tr, y_tr, X_te, y_te, method, m, iterations, seed = task
    X_tr, X_te = standardise(X_tr, X_te)
    Z = X_tr[random_rows(len(X_tr), m, seed)]
    clf = make_classifier(method, Z, iterations, seed, validation_data=(X_te, y_te))
    with count_convergence_warnings():
        try:
            clf, _, _, stopped = train(method, clf, X_tr, y_tr, iterations)
        except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
            return {"failure": f"{type(exc).__name__}: {exc}"[:200]}
    h = clf.history_
    return {"seconds": [e["seconds"] for e in h], "error": [e["val_error"] for e in h],
            "nll": [e["val_nll"] for e in h], "stopped": stopped}


def _mean_curves(curves):
    """Average the curves iteration by iteration, over the realisations that reached it."""
    length = max(len(c) for c in curves)
    out = []
    for k in range(length):
        vals = [c[k] for c in curves if len(c) > k]
        out.append(float(np.mean(vals)))
    return out


def run(m_values=M_VALUES, methods=METHOD_ORDER, n_splits=N_SPLITS, iterations=ITERATIONS, seed=0,
        jobs=1, progress=True):
    """One record per (method, m): mean curves ``seconds``, ``error``, ``nll`` (one entry per
    iteration), the final test error and NLL (means over the splits), n_splits, n_failed."""
    check_names(methods, METHOD_ORDER, "method", "sep-image")
    if n_splits < 1 or iterations < 1:
        raise ValueError("--splits and --iterations must be at least 1")
    X, y = load()
    keys, tasks = [], []
    for m in m_values:
        for meth in methods:
            for k in range(n_splits):
                train, test = split(len(y), seed, k)
                if not 1 <= m <= len(train):
                    raise ValueError(f"m must be in 1..{len(train)}, got {m}")
                tasks.append((X[train], y[train], X[test], y[test], meth, m, iterations, seed + k))
                keys.append((meth, m))
    grouped = map_cells(_fit, tasks, keys, jobs=jobs, desc="sep-image fits", show=progress)
    records = []
    for (meth, m), rs in grouped.items():
        ok = [r for r in rs if "failure" not in r]
        rec = {"method": meth, "m": m, "n_splits": len(ok), "n_failed": len(rs) - len(ok),
               "n_stopped": sum(r["stopped"] is not None for r in ok)}
        if ok:
            rec.update(seconds=_mean_curves([r["seconds"] for r in ok]),
                       error=_mean_curves([r["error"] for r in ok]),
                       nll=_mean_curves([r["nll"] for r in ok]),
                       final_error=float(np.mean([r["error"][-1] for r in ok])),
                       final_nll=float(np.mean([r["nll"][-1] for r in ok])),
                       time=float(np.mean([r["seconds"][-1] for r in ok])))
        if len(rs) != len(ok):
            rec["failures"] = sorted({r["failure"] for r in rs if "failure" in r})
        records.append(rec)
    return records


def format_table(records):
    lines = ["SEP Figure 3 left (Image, binary: sky/foliage/grass vs the rest): final test error / NLL",
             f"{'method':<8}{'m':>5}{'error':>8}{'NLL':>8}{'seconds':>9}{'splits':>8}"]
    for r in records:
        if not r["n_splits"]:
            lines.append(f"{r['method']:<8}{r['m']:>5}  failed: {r.get('failures')}")
        else:
            lines.append(f"{r['method']:<8}{r['m']:>5}{r['final_error']:>8.3f}{r['final_nll']:>8.3f}"
                         f"{r['time']:>9.1f}{r['n_splits']:>8}")
    return "\n".join(lines)


def doc_tables(records):
    """The markdown table of docs/reproduction.md, ``sep-image``: one row per m, per method the
    final test error / NLL / training seconds (means over the realisations that ran, their number
    in brackets where some failed), and the realisations run."""
    methods = [m for m in METHOD_ORDER if any(r["method"] == m for r in records)]
    ms = sorted({r["m"] for r in records})
    get = {(r["method"], r["m"]): r for r in records}
    rows = []
    for m in ms:
        row = [str(m)]
        for meth in methods:
            r = get.get((meth, m))
            if r is None:
                row.append("not run")
            elif not r["n_splits"]:
                row.append("failed")
            else:
                row.append(f"{r['final_error']:.3f} / {r['final_nll']:.3f} / {r['time']:.0f}"
                           + (f" ({r['n_splits']})" if r["n_failed"] else ""))
        runs = [r["n_splits"] + r["n_failed"] for r in records if r["m"] == m]
        rows.append(row + [str(max(runs))])
    header = ["m"] + [f"{meth.upper()} error / NLL / s" for meth in methods] + ["realisations"]
    return {"sep-image": markdown_table(header, rows)}


def add_arguments(parser):
    parser.add_argument("--m-values", nargs="+", type=int, default=list(M_VALUES), metavar="M",
                        help="numbers of inducing points (default 4 50 200)")
    parser.add_argument("--splits", type=int, default=N_SPLITS,
                        help="random 90/10 realisations (default 100, as in the paper)")
    parser.add_argument("--iterations", type=int, default=ITERATIONS,
                        help="batch iterations of every method (default 250)")
    add_doc_arguments(parser)


def main(args):
    if args.folds is not None or args.datasets:
        raise ValueError("sep-image has one data set and random splits: pass --splits")
    if args.from_json:
        records = read_records(args.from_json)
    else:
        records = run(args.m_values, args.methods or METHOD_ORDER, args.splits, args.iterations,
                      args.seed, args.jobs, not args.quiet)
    print(format_table(records))
    if args.plots:
        from .sep_plots import plot_time_curves
        print("wrote", plot_time_curves(records, args.plots, "sep-image.png",
                                        "Image (binary), test performance against training time"))
    if args.from_json or args.update_doc:
        publish_doc_tables(args, doc_tables(records))
    return records
