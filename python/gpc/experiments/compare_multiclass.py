"""The multiclass section of ``gpc compare``: one model of all classes against one-vs-rest EP.

One stratified held-out split (1/3 of the rows for testing, as RMGPC §4.1's 2/3 : 1/3; inputs
standardised on the training part), and on it ``MultiClassGPC`` with model "robust" (RMGPC: argmax
likelihood with an outlier indicator per row, EP), "standard" (SMGPC: no outliers, a latent noise
per class) and "heavy-tailed" (HTPC: hyperbolic-secant processes, multinomial logit, Laplace), and
``GaussianProcessClassifier``'s one-vs-rest EP; the models and kernels of the RMGPC reproduction
(:mod:`.rmgpc_table2`), hyperparameters by type-II ML.  Reported: test error, balanced accuracy
(mean over classes of the per-class accuracy, RMGPC §4.1's BCR), test NLL and fit time, and the
training rows RMGPC finds most likely mislabelled: the largest posterior outlier probabilities
P(zᵢ = 1 | y, X) (RMGPC eq. (21), ``outlier_probability_``).
"""

import numpy as np

from .compare import fit_line, held_out_fit, held_out_table, holdout_split, map_fits, say
from .rmgpc_glass_outliers import PAPER_PROBABILITY
from .rmgpc_table2 import _classifier

#: method labels -> the model name of the RMGPC reproduction
METHODS = {"rmgpc": "robust", "smgpc": "standard", "htpc": "heavy-tailed", "ovr-ep": "ovr-ep"}
WHAT = {"rmgpc": "MultiClassGPC(model='robust'): RMGPC, outlier indicators, EP",
        "smgpc": "MultiClassGPC(model='standard'): SMGPC, latent noise, EP",
        "htpc": "MultiClassGPC(model='heavy-tailed'): HTPC, heavy-tailed processes, Laplace",
        "ovr-ep": "GaussianProcessClassifier(method='ep', multi_class='one_vs_rest')"}
TEST_FRACTION = 1.0 / 3.0
#: training rows listed as most likely mislabelled
N_OUTLIERS = 5

CAPTION = ("MultiClassGPC (one model of all classes) against one-vs-rest binary EP on a multi-class set: "
           "higher balanced accuracy, lower error and NLL are better")


def _plain(value):
    """A label as a JSON-friendly Python value."""
    return value.item() if isinstance(value, np.generic) else value


def _fit_one(task):
    X_tr, y_tr, X_te, y_te, label, seed, train_rows = task
    model = _classifier(METHODS[label], seed)
    record = held_out_fit(model, X_tr, y_tr, X_te, y_te,
                          {"section": "multiclass", "method": label, "label": label})
    if record["error"] is not None and label == "rmgpc":
        prob = model.outlier_probability_
        top = np.argsort(prob, kind="stable")[::-1][:N_OUTLIERS]
        predicted = model.predict(X_tr[top])
        record["outliers"] = [{"row": int(train_rows[i]) + 1, "label": _plain(y_tr[i]),
                               "predicted": _plain(p), "probability": float(prob[i])}
                              for i, p in zip(top, predicted)]
    return record


def outlier_lines(record, paper=None):
    """The table of the training rows most likely mislabelled, from an RMGPC record; ``paper``
    ({row: probability}) adds a column of published probabilities (RMGPC Table 3 for glass)."""
    lines = ["Training rows most likely mislabelled (RMGPC's P(outlier | y, X), eq. (21); row: 1-based, in "
             "the data set's order):",
             f"{'row':>6} {'label':>12} {'RMGPC predicts':>15} {'P(outlier)':>11}"
             + (f" {'RMGPC paper, all rows':>22}" if paper else "")]
    for o in record["outliers"]:
        known = f" {paper[o['row']]:>22.2f}" if paper and o["row"] in paper else ""
        lines.append(f"{o['row']:>6} {str(o['label']):>12} {str(o['predicted']):>15} {o['probability']:>11.3f}"
                     + known)
    return lines


def run_section(data, labels, options):
    """The multiclass section on ``data``: records and the printed table."""
    X_tr, y_tr, X_te, y_te, train = holdout_split(data.X, data.y, TEST_FRACTION, options["seed"])
    rows = data.rows[train]
    work = [(X_tr, y_tr, X_te, y_te, label, options["seed"], rows) for label in labels]
    say(options, f"multiclass section: {data.name}, {len(y_tr)} training rows, {len(work)} fits")
    records = map_fits(_fit_one, work, list(range(len(work))), jobs=options["jobs"],
                       done=lambda _, rs: say(options, fit_line(rs[0]["label"], rs)))
    for r in records:
        r["dataset"] = data.name
    classes, counts = np.unique(data.y, return_counts=True)
    title = (f"{data.name}: {len(y_tr)} training / {len(y_te)} test rows (stratified), d = {data.X.shape[1]}, "
             f"{len(classes)} classes ({', '.join(f'{c}: {k}' for c, k in zip(classes, counts))}), "
             "RBF kernel, type-II ML")
    notes = [f"{label}: {WHAT[label]}" for label in labels]
    paper = PAPER_PROBABILITY if data.bundled == "glass" else None
    notes += [line for r in records if r.get("outliers") for line in [""] + outlier_lines(r, paper)]
    return records, held_out_table(records, f"{CAPTION}\n{title}", balanced=True, notes=notes)
