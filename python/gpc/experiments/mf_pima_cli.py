"""``gpc reproduce mf-pima``: MF paper, Table 1, through :func:`gpc.experiments.mf_pima.run`.

The experiment itself (Pima.tr/Pima.te, step likelihood, RBF with per-input weights plus a diagonal
term, free energy minimised by L-BFGS-B, both mean-field methods run at the minimum) lives in
``mf_pima.py``; this module only points it at the CSVs shipped in the package, prints, plots
and returns JSON records.
"""

import numpy as np

from ._common import data_path


def add_arguments(parser):
    parser.add_argument("--max-iter", type=int, default=200,
                        help="L-BFGS-B iterations per free-energy minimisation (default 200)")


def records_from_rows(rows):
    out = []
    for r in rows:
        for m in ("mf-ensemble", "mf-naive"):
            paper_err, paper_F = r["paper"][m]
            out.append({"minimised": r["minimised"], "method": m, "test_errors": int(r["errors"][m]),
                        "n_test": 332, "free_energy": float(r["free_energy"][m]),
                        "paper_test_errors": paper_err, "paper_free_energy": paper_F,
                        "w": np.asarray(r["w"]).tolist(), "v": float(r["v"]),
                        "n_evaluations": int(r["n_evaluations"])})
    return out


def run(max_iter=200):
    from . import mf_pima
    rows = mf_pima.run(data_path("pima_tr.csv"), data_path("pima_te.csv"), max_iter=max_iter)
    return rows


def main(args):
    if args.datasets and args.datasets != ["pima"]:
        raise ValueError("mf-pima runs on pima only")
    if args.methods:
        raise ValueError("mf-pima always runs both mean-field methods (mf-ensemble, mf-naive)")
    from .mf_pima import format_table
    rows = run(max_iter=args.max_iter)
    print("MF Table 1 (Pima, 200 train / 332 test): test errors and free energy −ln P(D)")
    print(format_table(rows))
    records = records_from_rows(rows)
    if args.plots:
        from .plots import plot_mf_pima
        print("wrote", plot_mf_pima(records, args.plots))
    return records
