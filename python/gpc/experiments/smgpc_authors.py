"""``gpc reproduce smgpc-authors``: gpc's scalable multi-class methods against the authors' R code.

Villacampa-Calvo & Hernández-Lobato (ICML 2017) published the R code of their four batch methods
(GitHub ``emakryo/scalable_multiclass_ep``): EP, SEP, GFITC and VI.  ``bench/authors_r/`` runs it
on the eight UCI sets and the 20 splits that gpc ships (:func:`gpc.datasets.load_smgpc`) and keeps
one JSON line per (data set, method, split); this command fits :class:`gpc.SparseMultiClassGPC`
in the same set-up on the same splits and prints both side by side, so that the comparison needs
no R.

The set-up is the authors' satellite scripts' (``experiments/satellite/*_batch``):

* inputs standardised with the training part's mean and s.d. (``ddof=1``, R's ``sd``);
* m = 100 inducing points per class at random training rows, each class's drawn apart (as the
  R scripts do), seeded by the split (gpc's ``inducing_points`` (C, m, d));
* per class σ² k_ℓ(x, x') + σ₀² δ with σ² = σ₀² = 1 (their log σ = log σ₀ = 0): the latent noise
  σ₀² is part of K_uu and of the FITC variances in both codes.  Their kernel is
  σ² exp(−½ Σ_j (x_j − x'_j)²/l_j) (it divides the inputs by √l) with every l_j started at the
  median distance between the standardised training rows, so gpc's ARD length-scales start at
  ℓ_j = √(that median);
* 250 iterations, in batch: EP and SEP as 250 damped site passes each followed by a step of the
  hyperparameters and Z; VI as 250 iterations of L-BFGS-B on the bound (a few more evaluations);
* EP's and SEP's schedule is theirs (``epMGPCInternal`` and ``optimize`` of their
  ``*MGPC_batch.R``): the damping starts at 0.5 and is multiplied by 0.99 after every pass
  (gpc's ``damping_decay``), and every log hyperparameter and inducing coordinate steps by its
  own rate times the gradient of log Z, each rate starting at 0.01 and multiplied by 1.02 (at
  most 1) while its gradient keeps its sign and by 0.5 when the sign flips (gpc's
  ``step_rule="adaptive"``: gpc's default, Adadelta, takes steps that do not grow with the
  gradient, a sum over the rows in batch, and climbs log Z far more slowly in 250 passes).
  Two details of their ``optimize`` are the experiment's own :class:`AuthorsRates`: their
  length-scale parameter is log l = 2 log ℓ, so that their step is a quarter of gpc's in log ℓ,
  and each log l rate grows while its previous gradient has the sign of the *sum* of the current
  log l gradients (over classes and dimensions), not its own;
* EP, SEP and GFITC fit the noiseless argmax on the noisy latent functions (gpc's
  ``model="standard"``: no label noise); VI adds the authors' fixed ε = 10⁻³, which puts
  (1 − ε) + ε/C on the argmax class and ε/C on each other class: gpc's ``label_noise`` is the
  total mass on the wrong classes, ε (C − 1)/C, held fixed.
* VI holds q in u-space as theirs does (mean and Cholesky factor of q(u_k)'s covariance, started
  at the prior: gpc's ``whiten=False``); whitened, the same bound has another gradient in the
  hyperparameters and L-BFGS-B ends at other optima (docs/reproduction-smgpc.md, smgpc-authors).
  Its L-BFGS-B is R's ``optim`` in their coordinates (:func:`authors_lbfgsb`, gpc's
  ``optimizer``): log l = 2 log ℓ for the length-scales, R's memory of 5 pairs and tolerances.

GFITC is the authors' EP on the same FITC model with the hyperparameters fitted by L-BFGS-B
around an EP run to convergence (Hernández-Lobato & Hernández-Lobato 2016, §4): the same model and
fixed point as gpc's batch EP, which has no separate GFITC schedule; the GFITC row therefore sets
the authors' GFITC against gpc's EP fit of the same split.

CPU seconds are ``time.process_time`` of the fit on one BLAS thread for gpc and R's
``proc.time`` (user + system) of the fit for the authors'.
"""

import functools
import json
import os

import numpy as np
from scipy.optimize import minimize
from scipy.spatial.distance import pdist

from .. import datasets
from ..kernels import RBF, ConstantKernel, WhiteKernel
from ..multiclass.sparse_estimator import SparseMultiClassGPC
from ..sparse.core.steps import AdaptiveRates
from ._common import count_convergence_warnings, map_tasks, multiclass_scores
from .publish import add_doc_arguments, markdown_table, publish_doc_tables, read_records
from .sep_common import timed_fit

SETS = datasets.SMGPC_SETS
#: the paper's four methods, in its order; gpc fits GFITC's rows with its EP (module docstring)
METHODS = ("ep", "sep", "gfitc", "vi")
M = 100
ITERATIONS = 250
#: the authors' fixed label noise in their VI (``eps = 0.001`` of fit_MSGPC_lBFGS)
EPS_AUTHORS = 1e-3
#: VI's budget of evaluations per L-BFGS-B iteration, a bound that R's runs stay far below
VI_EVALUATIONS = 3
#: the factor the authors' EP and SEP multiply their damping by after every pass
DAMPING_DECAY = 0.99
#: the committed records of the authors' code, beside the repository's bench/ harness
RECORDS_DIR = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir,
                                            os.pardir, "bench", "authors_r", "records"))


def standardise(X_train, X_test):
    """Zero mean and unit s.d. (``ddof=1``, as R's ``sd``) per feature, from the training part;
    a constant feature keeps s.d. 1."""
    mu, sd = X_train.mean(axis=0), X_train.std(axis=0, ddof=1)
    sd = np.where(sd > 0, sd, 1.0)
    return (X_train - mu) / sd, (X_test - mu) / sd


def length_scale(X):
    """√(median distance between the rows of X): the authors' heuristic for l, as gpc's ℓ."""
    return float(np.sqrt(np.median(pdist(X))))


def kernel(d, ell):
    """σ² = 1 times an ARD RBF started at ℓ_j = ``ell``, plus latent noise σ₀² = 1; bounds wide
    enough to hold the authors' (|log σ²|, |log σ₀²|, |log l| ≤ 10, so |log ℓ| ≤ 5)."""
    wide = (np.exp(-10.0), np.exp(10.0))
    return (ConstantKernel(1.0, wide) * RBF(np.full(d, ell), (np.exp(-5.0), np.exp(5.0)))
            + WhiteKernel(1.0, wide))


def vi_label_noise(n_classes):
    """gpc's ``label_noise`` for the authors' VI likelihood, ε(C − 1)/C with ε = EPS_AUTHORS: they
    put (1 − ε) + ε/C on the argmax class and ε/C on each of the C − 1 others
    (``vi_multiclass_batch.R``, ``lower_bound``), and gpc's label_noise is the total mass on the
    wrong classes."""
    return EPS_AUTHORS * (n_classes - 1) / n_classes


class AuthorsRates(AdaptiveRates):
    """The authors' ``optimize`` (``*MGPC_batch.R``) in gpc's coordinates: gpc's
    :class:`~gpc.sparse.core.steps.AdaptiveRates` with two changes on the length-scale entries
    (``length_scales``, a boolean mask over the first entries of the packed parameters; the
    rest, Z, are not length-scales).

    * Their parameter is log l = 2 log ℓ (their kernel divides the inputs by √l), so their step
      η ∂log Z/∂log l is η/4 ∂log Z/∂log ℓ in gpc's log ℓ: the length-scale steps are scaled by 1/4.
    * Their rate of every log l entry grows by ``up`` when that entry's previous gradient has the
      sign of the *sum* of the current gradients over all classes and dimensions
      (``sign$l == sign(sum(grad$gr_log_l))``), and shrinks by ``down`` otherwise; every other
      rate compares its own two signs, as in AdaptiveRates.

    ``functools.partial(AuthorsRates, length_scales=mask)`` is a ``step_rule`` of
    :class:`gpc.SparseMultiClassGPC` (:func:`authors_step_rule`).
    """

    def __init__(self, size, lr, length_scales):
        super().__init__(size, lr=lr)
        mask = np.asarray(length_scales, dtype=bool)
        self.length_scales = np.zeros(size, dtype=bool)
        self.length_scales[:mask.size] = mask
        self.scale = np.where(self.length_scales, 0.25, 1.0)

    def step(self, grad):
        signs = np.sign(grad)
        if self.signs is not None:
            same = signs == self.signs
            same[self.length_scales] = (self.signs[self.length_scales]
                                        == np.sign(grad[self.length_scales].sum()))
            self.rates = np.where(same, np.minimum(self.up * self.rates, self.max_rate),
                                  self.down * self.rates)
        self.signs = signs
        return self.lr * self.rates * grad * self.scale


def length_scale_entries(kern, n_classes):
    """The length-scale entries of the packed parameters of ``n_classes`` classes with their own
    copy of ``kern`` (a boolean mask over their first entries: every class's log θ in
    ``kern.theta`` order)."""
    per_class = ["length_scale" in name for name in kern.hyperparameter_names]
    return np.tile(per_class, n_classes)


def authors_step_rule(kern, n_classes):
    """``step_rule`` of SparseMultiClassGPC: :class:`AuthorsRates` with every class's length-scale
    entries marked."""
    return functools.partial(AuthorsRates, length_scales=length_scale_entries(kern, n_classes))


def authors_lbfgsb(obj_func, initial_theta, bounds, length_scales, iterations):
    """R's ``optim(method = "L-BFGS-B", control = list(maxit = iterations))`` of the authors' VI
    (``fit_MSGPC_lBFGS``) in their coordinates, as gpc's ``optimizer`` (scikit-learn's convention):
    their length-scale parameter is log l = 2 log ℓ (``length_scales``, a mask over the first
    entries), which L-BFGS-B's steps do not ignore; R's memory of 5 correction pairs (``lmm``),
    its ``factr`` of 10⁷ (scipy's ``ftol`` = factr times the machine ε) and ``pgtol`` of 0."""
    scale = np.ones(len(initial_theta))
    scale[:len(length_scales)][np.asarray(length_scales, dtype=bool)] = 2.0

    def theirs(t):
        value, grad = obj_func(t / scale)
        return value, grad / scale

    res = minimize(theirs, initial_theta * scale, jac=True, method="L-BFGS-B",
                   bounds=bounds * scale[:, None],
                   options={"maxcor": 5, "ftol": 1e7 * np.finfo(float).eps, "gtol": 0.0,
                            "maxiter": iterations, "maxfun": 10 ** 9})
    return res.x / scale, res.fun


def class_rows(n, m, n_classes, seed):
    """Each class's m distinct random rows of n, (C, m) sorted indices, seeded: their inducing
    points' start (the R scripts draw each class's apart)."""
    rng = np.random.default_rng(seed)
    return np.stack([np.sort(rng.choice(n, size=m, replace=False)) for _ in range(n_classes)])


def make_classifier(method, Zs, ell, n_classes, iterations, seed):
    """gpc's estimator for the authors' ``method`` (module docstring) from the classes' starting
    inducing points Zs (C, m, d)."""
    kern = kernel(Zs.shape[-1], ell)
    common = dict(kernel=kern, n_inducing=Zs.shape[1], inducing_points=Zs,
                  batch_size=None, max_iter=iterations, progress=False, random_state=seed, n_jobs=1)
    if method == "vi":
        # R's maxit counts L-BFGS-B's iterations, gpc's max_iter the bound's evaluations (a few
        # more): the optimiser stops at the iterations, the budget only bounds its line searches
        optimizer = functools.partial(authors_lbfgsb, iterations=iterations,
                                      length_scales=length_scale_entries(kern, n_classes))
        common["max_iter"] = VI_EVALUATIONS * iterations
        return SparseMultiClassGPC(method="vi", model="robust", label_noise=vi_label_noise(n_classes),
                                   label_noise_bounds="fixed", whiten=False, optimizer=optimizer,
                                   **common)
    return SparseMultiClassGPC(model="standard", tied_sites=method == "sep", damping=0.5,
                               damping_decay=DAMPING_DECAY,
                               step_rule=authors_step_rule(kern, n_classes), **common)


def _fit(task):
    name, split, method, m, iterations = task
    X_tr, y_tr, X_te, y_te = datasets.smgpc_split(name, split)
    X_tr, X_te = standardise(X_tr, X_te)
    ell = length_scale(X_tr)
    C = len(np.unique(y_tr))
    Zs = X_tr[class_rows(len(X_tr), min(m, len(X_tr)), C, split)]
    clf = make_classifier(method, Zs, ell, C, iterations, split)
    rec = {"dataset": name, "method": method, "split": split + 1, "m": Zs.shape[1],
           "length_scale": ell, "iterations": iterations}
    with count_convergence_warnings() as caught:
        try:
            cpu, wall = timed_fit(clf, X_tr, y_tr)
            error, nll = multiclass_scores(clf.predict_proba(X_te), clf.classes_, y_te)
        except (ValueError, ArithmeticError, np.linalg.LinAlgError) as exc:
            rec["failure"] = f"{type(exc).__name__}: {exc}"[:200]
            return rec
    rec.update(error=error, nll=nll, cpu_s=cpu, wall_s=wall, n_iter=int(clf.n_iter_),
               n_warnings=len(caught))
    return rec


def run(names=SETS, methods=METHODS, splits=range(1, 21), m=M, iterations=ITERATIONS, jobs=1,
        progress=True):
    """gpc's records: one per (data set, method, split), splits numbered 1..20 as in R (``splits``:
    the same for every set, or a dict from set to its splits).  GFITC's records are EP's (fitted
    once) under the method name "gfitc"."""
    for meth in methods:
        if meth not in METHODS:
            raise ValueError(f"unknown method {meth!r} for smgpc-authors; choose from {', '.join(METHODS)}")
    for name in names:
        if name not in SETS:
            raise ValueError(f"unknown data set {name!r} for smgpc-authors; choose from {', '.join(SETS)}")
    fitted = [meth for meth in methods if meth != "gfitc"]
    if "gfitc" in methods and "ep" not in fitted:
        fitted.insert(0, "ep")
    per_set = splits if isinstance(splits, dict) else {name: splits for name in names}
    tasks = [(name, s - 1, meth, m, iterations) for name in names for s in per_set.get(name, ())
             for meth in fitted]
    records = map_tasks(_fit, tasks, jobs=jobs, desc="smgpc-authors fits", show=progress)
    if "gfitc" in methods:
        records += [dict(r, method="gfitc", fitted_as="ep") for r in records if r["method"] == "ep"]
    return [r for r in records if r["method"] in methods]


def read_authors(directory=RECORDS_DIR):
    """The authors' records: every JSON line of ``directory/<set>.jsonl`` for the eight sets
    (bench/authors_r; its other records, such as Fashion-MNIST's, are not this table's)."""
    out = []
    if not os.path.isdir(directory):
        return out
    for fname in sorted(os.listdir(directory)):
        if fname.endswith(".jsonl") and fname[:-len(".jsonl")] in SETS:
            with open(os.path.join(directory, fname), encoding="utf-8") as fh:
                out += [json.loads(line) for line in fh if line.strip()]
    return out


def _stats(values):
    v = np.asarray(values, dtype=float)
    return (float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0) if len(v) else (None, None)


def summarise(ours, theirs):
    """One row per (data set, method) present in either: mean and s.d. over the splits of the test
    error and NLL, mean CPU seconds, and the splits behind each, for gpc and for the authors.  Only
    the splits that both codes ran enter the means, so that the two sides see the same splits."""
    def index(records):
        return {(r["dataset"], r["method"], int(r["split"])): r for r in records if "error" in r}

    a, b = index(ours), index(theirs)
    rows = []
    for name in SETS:
        for meth in METHODS:
            keys_a = {k[2] for k in a if k[:2] == (name, meth)}
            keys_b = {k[2] for k in b if k[:2] == (name, meth)}
            if not keys_a and not keys_b:
                continue
            both = sorted(keys_a & keys_b) or sorted(keys_a | keys_b)
            row = {"dataset": name, "method": meth, "splits": both, "n_both": len(keys_a & keys_b)}
            for side, idx in (("gpc", a), ("authors", b)):
                rs = [idx[(name, meth, s)] for s in both if (name, meth, s) in idx]
                for key in ("error", "nll", "cpu_s"):
                    row[f"{side}_{key}_mean"], row[f"{side}_{key}_sd"] = _stats([r[key] for r in rs])
                row[f"{side}_n"] = len(rs)
            rows.append(row)
    return rows


#: what a cell without records shows
MISSING = "—"


def every_cell(rows):
    """``rows`` (:func:`summarise`) completed to one per (data set, method) of the paper's eight
    sets and four methods, in that order: a pair neither code ran gets a row without values."""
    have = {(r["dataset"], r["method"]): r for r in rows}
    empty = {f"{side}_{key}_{stat}": None for side in ("gpc", "authors")
             for key in ("error", "nll", "cpu_s") for stat in ("mean", "sd")}
    return [have.get((name, meth), dict(empty, dataset=name, method=meth, splits=[], n_both=0,
                                        gpc_n=0, authors_n=0))
            for name in SETS for meth in METHODS]


def _ms(mean, sd, fmt=".3f"):
    return MISSING if mean is None else f"{mean:{fmt}} ± {sd:{fmt}}"


def _cpu(mean):
    return MISSING if mean is None else f"{mean:.1f}"


def _ratio(row):
    g, r = row["gpc_cpu_s_mean"], row["authors_cpu_s_mean"]
    return MISSING if g is None or r is None or r <= 0 else f"{g / r:.2f}"


def _splits(row):
    """The splits behind a row: those both codes ran, else each side's count."""
    if row["n_both"]:
        return f"{row['n_both']}"
    if not row["gpc_n"] and not row["authors_n"]:
        return MISSING
    return f"gpc {row['gpc_n']}, R {row['authors_n']}"


def doc_tables(rows):
    """The markdown table ``smgpc-authors:table``: per data set and method (all eight sets and four
    methods, :func:`every_cell`), test error and NLL (mean ± s.d. over the splits both codes ran,
    or over each side's where they share none) and mean CPU seconds of gpc and of the authors' R;
    MISSING where a side has no record."""
    rows = every_cell(rows)
    header = ["data set", "method", "splits", "error gpc", "error authors", "NLL gpc", "NLL authors",
              "CPU s gpc", "CPU s authors", "CPU ratio"]
    body = [[r["dataset"], r["method"].upper(), _splits(r),
             _ms(r["gpc_error_mean"], r["gpc_error_sd"]), _ms(r["authors_error_mean"], r["authors_error_sd"]),
             _ms(r["gpc_nll_mean"], r["gpc_nll_sd"]), _ms(r["authors_nll_mean"], r["authors_nll_sd"]),
             _cpu(r["gpc_cpu_s_mean"]), _cpu(r["authors_cpu_s_mean"]), _ratio(r)]
            for r in rows]
    return {"smgpc-authors:table": markdown_table(header, body)}


def format_table(rows):
    lines = ["smgpc-authors: test error and NLL, mean ± s.d. over the splits both codes ran; CPU s",
             f"{'set':<12}{'method':<7}{'n':>3}{'err gpc':>16}{'err R':>16}{'NLL gpc':>16}"
             f"{'NLL R':>16}{'CPU gpc':>9}{'CPU R':>9}"]
    for r in every_cell(rows):
        cpu = [_cpu(r[f"{s}_cpu_s_mean"]) for s in ("gpc", "authors")]
        lines.append(f"{r['dataset']:<12}{r['method']:<7}{r['n_both']:>3}"
                     f"{_ms(r['gpc_error_mean'], r['gpc_error_sd']):>16}"
                     f"{_ms(r['authors_error_mean'], r['authors_error_sd']):>16}"
                     f"{_ms(r['gpc_nll_mean'], r['gpc_nll_sd']):>16}"
                     f"{_ms(r['authors_nll_mean'], r['authors_nll_sd']):>16}{cpu[0]:>9}{cpu[1]:>9}")
    return "\n".join(lines)


def add_arguments(parser):
    parser.add_argument("--splits", type=int, nargs="+", metavar="S",
                        help="splits to fit, numbered 1..20 as in the R scripts (default: those the "
                             "authors' records hold for each data set; none for a set they do not "
                             "cover, whose cells show —)")
    parser.add_argument("--n-inducing", type=int, default=M, help="m per class (default 100)")
    parser.add_argument("--iterations", type=int, default=ITERATIONS, help="default 250")
    parser.add_argument("--authors", metavar="DIR", default=RECORDS_DIR,
                        help="the authors' records (*.jsonl; default bench/authors_r/records)")
    add_doc_arguments(parser)


def main(args):
    if args.folds is not None:
        raise ValueError("smgpc-authors uses the paper's 20 fixed splits, not folds: pass --splits")
    theirs = read_authors(args.authors)
    if args.from_json:
        ours = read_records(args.from_json)
    else:
        names = args.datasets or list(SETS)
        methods = args.methods or list(METHODS)
        if args.splits:
            splits = sorted(set(args.splits))
            for s in splits:
                if not 1 <= s <= datasets.SMGPC_N_SPLITS:
                    raise ValueError(f"--splits must lie in 1..{datasets.SMGPC_N_SPLITS}, got {s}")
        else:
            splits = {name: sorted({int(r["split"]) for r in theirs
                                    if r["dataset"] == name and r["method"] in methods})
                      for name in names}
        ours = run(names, methods, splits, m=args.n_inducing, iterations=args.iterations,
                   jobs=args.jobs or 1, progress=not args.quiet)
    rows = summarise(ours, theirs)
    print(format_table(rows))
    if args.from_json or args.update_doc:
        publish_doc_tables(args, doc_tables(rows))
    return ours
