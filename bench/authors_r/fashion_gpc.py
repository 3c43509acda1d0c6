"""gpc's SEP on Fashion-MNIST in the set-up of the authors' stochastic SEP (``run_mnist.R``).

    OPENBLAS_NUM_THREADS=1 python bench/authors_r/fashion_gpc.py IDX_DIR OUT_JSONL EPOCHS [--damping D]
    python bench/authors_r/fashion_gpc.py --table SEP_JSONL GPC_JSONL

IDX_DIR holds the four gzipped IDX files of Fashion-MNIST (Debian package
``dataset-fashion-mnist``).  One JSON line per epoch is appended to OUT_JSONL: the test error and
NLL on the 10,000 test images, and the cumulative CPU (``time.process_time``) and wall seconds of
training, the scorings excluded.

The set-up is the authors' ``simulate_SEP_MNIST_Stochastic.R`` as far as the estimator allows:

* all 60,000 training rows, the ten class codes as labels, inputs / 255;
* :class:`gpc.SparseMultiClassGPC` with tied sites (stochastic EP), ``model="standard"`` (the
  noiseless argmax of the noisy latent functions, their likelihood), minibatches of 200 rows
  (``batch_size``), m = 200 inducing points per class (``n_inducing``) started at 200 random
  training rows; the R code draws each class's rows apart, the estimator starts every class at the
  same rows;
* per class σ² exp(−½ Σ_j (x_j − x'_j)²/ℓ_j²) + σ₀² δ with σ² = σ₀² = 1 (their log σ = log σ₀ =
  0) and every ℓ_j = √l, l the median distance between 1000 random training rows (their heuristic:
  their kernel divides the inputs by √l);
* site damping 1 by default, as their stochastic code (``damping <- 1``, its annealing commented
  out): each minibatch replaces its rows' share of the tied site, S ← (1 − |M|/n) S + Σ_M t_i;
* the hyperparameters, Z and nothing else follow the minibatch gradient after every minibatch by
  gpc's own rule, Adadelta with step multiplier ``learning_rate`` = 1 (theirs: Adam, step 10⁻³);
* one process, one BLAS thread, ``n_jobs=1``.

The epochs are ``partial_fit`` calls, each one pass over a fresh permutation of the rows, so the
model can be scored between them outside the timed part.

``--table`` prints the markdown table of docs/reproduction-smgpc.md from the two record files: per
epoch the authors' and gpc's test error, NLL and training CPU seconds.  The authors' loop scores
after minibatches 1, 1 + P, 1 + 2P, … (``run_mnist.R``), so its point for epoch k < E is the one
after minibatch 300k + 1, one minibatch into the next epoch; epoch E is its final scoring.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
from scipy.spatial.distance import pdist
from threadpoolctl import threadpool_info

import gpc
from gpc.datasets._idx import FILES, read_idx
from gpc.experiments._common import multiclass_scores
from gpc.experiments.sep_common import random_rows
from gpc.experiments.smgpc_authors import kernel

M = 200
BATCH = 200
SEED = 0
HEURISTIC_ROWS = 1000


def load(idx_dir, part):
    """(pixels / 255, class codes 0-9) of the "train" or "test" part."""
    images, labels = (os.path.join(idx_dir, f) for f in FILES[part])
    X = read_idx(images)
    return X.reshape(len(X), -1) / 255.0, read_idx(labels).astype(np.int64)


def length_scale(X, seed):
    """(l, √l): l the median distance between HEURISTIC_ROWS random rows of X (the authors'
    heuristic), √l gpc's ℓ."""
    rows = np.random.default_rng(seed).choice(len(X), size=HEURISTIC_ROWS, replace=False)
    l = float(np.median(pdist(X[rows])))
    return l, float(np.sqrt(l))


def read_jsonl(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def authors_by_epoch(records):
    """{epoch k: the authors' record of epoch k}: the final scoring, and the in-loop scorings that
    fall one minibatch after an epoch's end."""
    out = {}
    for r in records:
        per_epoch = r["n_train"] // r["minibatch"]
        if r["final"]:
            out[r["epochs"]] = r
        elif r["minibatches"] > 1 and (r["minibatches"] - 1) % per_epoch == 0:
            out.setdefault((r["minibatches"] - 1) // per_epoch, r)
    return out


def table(sep_path, gpc_path):
    """The markdown table of the two runs, one row per epoch that either has ("—" where the
    other has none yet)."""
    theirs = authors_by_epoch(read_jsonl(sep_path))
    ours = {r["epoch"]: r for r in read_jsonl(gpc_path)}
    lines = ["| epoch | error authors | error gpc | NLL authors | NLL gpc | CPU s authors | "
             "CPU s gpc | CPU ratio gpc / authors |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k in sorted(set(theirs) | set(ours)):
        a, g = theirs.get(k), ours.get(k)
        cells = [f"{100 * r['error']:.2f} %" if r else "—" for r in (a, g)]
        cells += [f"{r['nll']:.4f}" if r else "—" for r in (a, g)]
        cells += [f"{r['cpu_s']:.0f}" if r else "—" for r in (a, g)]
        cells.append(f"{g['cpu_s'] / a['cpu_s']:.2f}" if a and g else "—")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--table"]:
        if len(argv) != 3:
            sys.exit(__doc__)
        print(table(argv[1], argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("idx_dir")
    parser.add_argument("out")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--damping", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=1.0)
    args = parser.parse_args(argv)

    X, y = load(args.idx_dir, "train")
    X_te, y_te = load(args.idx_dir, "test")
    l, ell = length_scale(X, SEED)
    Z = X[random_rows(len(X), M, SEED)]
    clf = gpc.SparseMultiClassGPC(
        kernel=kernel(X.shape[1], ell), n_inducing=M, inducing_points=Z, model="standard",
        tied_sites=True, batch_size=BATCH, damping=args.damping, learning_rate=args.learning_rate,
        progress=False, random_state=SEED, n_jobs=1)
    blas = [f"{i['internal_api']} {i['version']} ({i['num_threads']} threads)"
            for i in threadpool_info() if i["user_api"] == "blas"]
    common = {"dataset": "fashion-mnist", "method": "sep-tied", "m": M, "minibatch": BATCH,
              "n_train": len(X), "n_test": len(X_te), "epochs": args.epochs,
              "damping": args.damping, "learning_rate": args.learning_rate,
              "length_scale_heuristic": l, "gpc_version": gpc.__version__,
              "python": sys.version.split()[0], "numpy": np.__version__, "blas": blas}
    cpu = wall = 0.0
    classes = np.unique(y)
    for epoch in range(1, args.epochs + 1):
        c0, w0 = time.process_time(), time.perf_counter()
        clf.partial_fit(X, y, classes=classes)
        cpu += time.process_time() - c0
        wall += time.perf_counter() - w0
        error, nll = multiclass_scores(clf.predict_proba(X_te), clf.classes_, y_te)
        rec = dict(common, epoch=epoch, error=error, nll=nll, cpu_s=round(cpu, 3),
                   wall_s=round(wall, 3), log_evidence=float(clf.log_marginal_likelihood_value_))
        with open(args.out, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
