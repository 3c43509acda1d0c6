"""``SparseGaussianProcessClassifier``: inducing-point GP classification for large n (SEP paper).

Method names.  The exact engine (``gpc.infer``, ``python -m gpc compare``) uses "sep" for
*sequential* EP, after PL Table I's labels PEP/SEP/PPL/SPL.  The sparse estimator therefore never
says "sep": its ``method`` is "ep" (the scalable EP of the SEP paper, §2), "pl" (posterior
linearisation on the same sites), "gfitc" or "svi" (the baselines of SEP §3).
"""

import warnings
from typing import Optional

import numpy as np
from numpy.typing import ArrayLike
from scipy.cluster.vq import kmeans2

from .._estimator import _scale_of, as_rows, median_length_scale
from .._parallel import BLOCK_ROWS
from ..inference.rules import DEFAULT_ON_NEGATIVE, Rule
from ..kernels import RBF, ConstantKernel, as_kernel, user_kernel
from ..likelihoods import get_likelihood
from ._train import PRECISIONS, EngineRows, InProcessRows, SEPState
from .base import SparseEstimator
# the "auto" training defaults that batch_size and max_iter document below
from .base import AUTO_BATCH_SIZE, AUTO_MIN_EPOCHS, AUTO_MINIBATCH_FROM  # noqa: F401
from .baselines import GFITCState, SVIState
from .core.natural import posterior_predict
from .core.trainers import LBFGSTrainer, SEPBatch, SEPMinibatch, SEPTied, SVIMinibatch

METHODS = ("ep", "pl", "gfitc", "svi")

#: Z's Adadelta steps as a share of θ's in per-row minibatch SEP (``learning_rate``)
MINIBATCH_Z_RATE = 0.1
#: rows used for the k-means initialisation of Z
_INIT_ROWS = 10_000


def default_kernel(X, rng):
    """ConstantKernel(1) · RBF(ℓ₀) with ℓ₀ the median heuristic and length-scale bounds ℓ₀ · 10^±5:
    bounds relative to the data's scale, so inputs measured in any unit start inside them."""
    ell = median_length_scale(X, rng)
    return ConstantKernel(1.0) * RBF(ell, length_scale_bounds=(1e-5 * ell, 1e5 * ell))


def _distinct(rows):
    """The distinct rows, in their order."""
    _, first = np.unique(rows, axis=0, return_index=True)
    return rows if len(first) == len(rows) else rows[np.sort(first)]


def initial_inducing(X, m, how, rng):
    """Z: k-means (scipy's kmeans2, k-means++ seeds) on a subsample, or random rows; at most as
    many points as the subsample has distinct rows (a repeated inducing point adds nothing but a
    singular K_uu)."""
    n = X.shape[0]
    if not isinstance(how, str):
        Z = np.asarray(how, dtype=np.float64)
        if Z.ndim != 2 or Z.shape[1] != X.shape[1] or not np.all(np.isfinite(Z)):
            raise ValueError(f"inducing_points must be a finite (m, {X.shape[1]}) array, got shape "
                             f"{Z.shape}")
        return Z.copy()
    if how not in ("kmeans", "random"):
        raise ValueError(f"inducing_points must be 'kmeans', 'random' or an array, got {how!r}")
    if m > n:
        # scikit-learn's Nystroem does the same with n_components > n_samples
        warnings.warn(f"n_inducing={m} is more than the {n} training rows: {n} inducing points are "
                      f"used (pass n_inducing <= {n} to silence this)", UserWarning, stacklevel=4)
        m = n
    if how == "random":
        return _distinct(as_rows(X, np.sort(rng.choice(n, size=m, replace=False))))
    sample = as_rows(X, np.sort(rng.choice(n, size=min(n, max(_INIT_ROWS, m)), replace=False)))
    # k-means++ draws each seed with probability ∝ its squared distance to the seeds so far, 0/0
    # once the seeds cover every distinct row: the distinct rows are the candidates
    distinct = _distinct(sample)
    if m >= len(distinct):
        return distinct
    scale = _scale_of(distinct)           # squared distances of rows near 1e154 overflow
    Z, _ = kmeans2(distinct / scale, m, minit="++", seed=rng)
    return Z * scale


class _BinarySparse:
    """One ±1 problem: the SEP state and its training loop."""

    def __init__(self, state, likelihood):
        self.state, self.likelihood = state, likelihood

    def latent(self, X):
        A, s = self.state.factor.whiten(X)
        return posterior_predict(A, s, self.state.q)

    def proba_positive(self, X):
        mean, var = self.latent(X)
        return self.likelihood.predictive_probability(mean, np.maximum(var, 1e-300))


class SparseGaussianProcessClassifier(SparseEstimator):
    """Gaussian process classification with m inducing points (SEP paper, §2).

    The latent f has a GP prior; inducing values u = f(Z) carry it, each label's factor is
    φ_i(u) = ∫ p(y_i|f) N(f | k_iᵀK_uu⁻¹u, s_i) df with the FITC variance s_i (SEP eq. (1)), and EP
    approximates q(u) with rank-one sites (eq. (2)).  Hyperparameters and Z follow the gradient
    (eq. (4), minibatch eq. (6)) of log Z_q (eq. (3)) with Adadelta after each site pass or
    minibatch (SEP §2.3).  Time O(n m²) per epoch; memory two scalars per row plus O(m²), and for
    minibatch training m float32 per row (each site's direction, so that q stays the sum of its
    sites; 800 MB at n = 10⁶, m = 200).

    Parameters
    ----------
    kernel : gpc or scikit-learn kernel, optional
        Default: ConstantKernel(1.0) * RBF(median distance of a subsample) (the median heuristic).
        Fixed bounds ("fixed") hold a hyperparameter.
    n_inducing : int, default 100
        m, the number of inducing points.  With ``inducing_points`` "kmeans" or "random", an
        m above the n training rows warns and uses n (as scikit-learn's ``Nystroem`` does).
    inducing_points : "kmeans", "random" or array (m, d), default "kmeans"
        k-means (scipy) on a subsample of at most 10,000 rows, random rows, or given points.
    method : "ep", "pl", "gfitc" or "svi", default "ep"
        "ep" is the scalable EP of the SEP paper (not "sep": gpc's exact engine uses that name
        for *sequential* EP).  "pl": posterior linearisation (PL paper eq. (9)-(18)) on the same
        rank-one sites and the same training, each site the statistical linear regression of its
        label on a_iᵀw under q (never a negative site); its log Z_q is PL eq. (18) for the sparse
        model and its gradient that of the linearised model's evidence (docs/sparse.md).
        "gfitc": EP on the FITC prior run to convergence (site changes
        below 1e-4) at every (θ, Z), with L-BFGS-B on its evidence; batch only.  "svi": the bound (8) with a
        whitened q(u) = N(μ, L_q L_qᵀ), by L-BFGS-B in batch or Adadelta on minibatches.  See
        :mod:`gpc.sparse.baselines`.
    likelihood : "probit", "logit", "noisy_threshold" or a Likelihood, default "probit"
    on_negative : "keep", "keep-skip", "clip", "skip", "pl" or "raise", default "keep"
        Methods "ep" and "gfitc": what a site update with a negative variance does, as in the exact
        EP (``gpc.infer``; non-log-concave likelihoods such as the noisy threshold).  "keep" (the
        exact EP's default) keeps negative site precisions, whose fixed point is EP's, and only a
        site without a cavity falls back to PL's update (or keeps its old site, "keep-skip");
        "clip" sets every negative site precision to 1e-8 (the PL paper's Table I protocol; it
        moves the fixed point); "skip" keeps the old site and "pl" takes PL's update whenever the
        update is negative; "raise" keeps negative sites and raises NegativeVarianceError at a
        cavity that is not a distribution.  ``n_fixed`` of each problem's state counts the updates
        a policy handled.
    batch_size : int, None or "auto", default "auto"
        None trains in batch (parallel site passes over all rows, one inner step per pass);
        an int trains on minibatches of that many rows (eq. (6), stochastic step scaled by
        ``n/|M|``); one of n rows or more is batch training.  Each epoch draws a permutation of
        the rows (``random_state``) and cuts it into minibatches, so every row is seen once per
        epoch and a minibatch is a random subset of the rows whatever their order in X
        (class-sorted rows train as shuffled ones); its rows are read in row order, with one
        fancy index (NumPy, ``np.memmap`` and Dask X alike).  "auto": batch below 10,000 rows,
        minibatches of 2,000 rows from there on (GFITC always trains in batch).  A minibatch
        step costs about b/n of a batch pass and moves θ and Z as far, so large data sets reach a
        good model in a few epochs.
    max_iter : int or "auto", default "auto"
        Epochs (passes over the data), batch or minibatch.  For the L-BFGS-B fits (GFITC, batch
        SVI) it is the number of objective evaluations (for GFITC each one a converged EP).
        "auto": batch EP stops at the first pass that moves no site by more than 1e-8, within
        1000 passes at fixed θ and Z (Anderson-accelerated: tens of passes on the UCI sets) and
        100 epochs otherwise; 100 for the other batch fits; on minibatches as many epochs as see about 400,000 rows (at least
        2, at most 100): 8 epochs of 50,000 rows, 2 of a million.  For more accuracy give more
        epochs (the history's ``val_nll`` with ``validation_data`` shows when it stops
        improving), more inducing points (``n_inducing``), and for runs of thousands of
        minibatches ``learning_rate=0.1``.
    learning_rate : float, default 1.0
        Adadelta's step multiplier (ρ = 0.9, ε = 1e-5).  A step that fails is undone and this is
        halved (counted in ``history_``).  Under minibatch noise Adadelta's steps grow with the
        number of steps, so runs of thousands of minibatches per epoch end nearer the optimum
        with 0.1 (the sparse guide); short runs learn faster with 1.  On per-row minibatches Z's
        steps are ``MINIBATCH_Z_RATE`` (0.1) times θ's: its m·d coordinates each get Adadelta's
        step whatever their gradient's noise, and at the full rate Z's moves cost test NLL
        (the first epoch's most; bench/RESULTS.md, "Time to accuracy").
    damping : float in (0, 1] or None, default None
        New site = damping · matched + (1 - damping) · old.  None: 1 for minibatches with per-row
        sites, 0.5 otherwise.  A batch pass moves every site at once from the same q, which
        damping steadies; a minibatch refines each row once per epoch against a q that its
        b - 1 companions barely move, and the gradient (eq. (4)) taken right after assumes the
        refined sites' moments match (damped, the amplitude grew without bound).  The tied site
        is a running average, which damping smooths.
    optimize_inducing : bool, default True
        Move Z along the gradient too.  With every kernel bound "fixed" and this False, ``fit``
        runs the site updates alone.
    tied_sites : bool, default False
        method "ep" only: one shared average site instead of one per row (stochastic EP, Li,
        Hernández-Lobato & Turner 2015; beyond the SEP paper).  The state is O(m²) whatever n,
        and ``partial_fit`` then accepts any rows (a stream).  Trains on blocks of
        ``batch_size`` rows (4096 when None or larger than n).
    jitter : float, default 1e-8
        Added to K_uu's diagonal, relative to its mean diagonal.
    validation_data : (X_val, y_val) or None
        Held-out data scored after every epoch into ``history_`` (error and mean NLL).
    progress : bool, default True
        A tqdm progress bar over the training steps while ``fit`` runs (when tqdm, an optional
        extra, is installed; it disappears when the fit ends).  False turns it off.
    random_state : int, Generator or None
        Seeds the inducing-point initialisation and the minibatches (``batch_size``): the same
        seed gives the same fit, bit for bit, for every ``n_jobs``.
    verbose : bool, default False
        Print one line per epoch.
    client : dask.distributed.Client, a gpc.distributed engine, or None, default None
        Train on a Dask cluster (SEP §2.3, Fig. 1 right; see the distributed guide): the rows
        and their sites (for minibatch SEP also the sites' directions) are split into one
        shard per worker (a Dask array keeps its row chunks) and stay there; each step sends q
        and θ out and gets O(m²) sums back.  Batch and minibatch SEP, tied sites and SVI (batch
        and minibatch) all run there; each worker takes its share of every minibatch.
        ``method="gfitc"`` raises a ValueError: GFITC's evidence is not a sum over the data
        (SEP §3).  A batch fit equals the in-process one up to the order of the sums;
        ``client=gpc.distributed.InProcessEngine(n_shards=K)`` runs the same shards in this
        process, which reproduces a minibatch fit on K workers.  A Dask client needs the
        ``distributed`` extra (``pip install "gpc[distributed]"``).  Clones share the client; a
        pickled model drops it (``client=None`` after unpickling).
    n_jobs : int or None, default None
        Threads of the fit and of prediction, with joblib's convention: None as many as BLAS may
        use (threadpoolctl's limit, else OMP_NUM_THREADS / OPENBLAS_NUM_THREADS, else every core),
        -1 every core, -2 all but one, k > 0 exactly k.  Each minibatch, and each block of a
        batch pass or of prediction, is cut into fixed blocks of rows (their sizes depend on the
        rows and m only) that run on these threads, while every BLAS library runs on one thread
        per call for the duration (threadpoolctl when installed, else OpenBLAS's own
        ``openblas_set_num_threads``; with another BLAS and neither, the blocks run in one
        thread); the m x m work of a step runs once.  The blocks' sums are added in block order,
        so the fitted model and its predictions are the same bits for every ``n_jobs``.
    precision : "float64" or "mixed", default "float64"
        "mixed" runs a minibatch step's b-row work in float32: the squared exponential's
        K_bu and its gradient contraction, the whitened rows A = K_bu L⁻ᵀ, their marginals'
        triangular products with R⁻¹, the old sites' directions a' = Lᵀv, the Gram sums
        Σ τ a aᵀ of the site swap, the new directions v = L⁻ᵀa and the evidence gradient's
        products (SEP §2.3, eq. (6)).  What is summed over the rows is accumulated in double, and
        the sites, q's natural parameters and factor, log Z_q, the m x m work and prediction
        stay float64.  Measured at n = 200,000 to 10⁶, m = 200, b = 2,000 on 2 threads: 10
        epochs in 0.63-0.72 of float64's time, the test NLL within 2e-4 of float64's
        (docs/sparse.md, "Precision").  Minibatch SEP (method "ep" or "pl",
        ``batch_size`` below n, per-row sites, in process) only: with batch training,
        ``tied_sites``, ``client`` or methods "gfitc" and "svi" it raises a ValueError.

    Attributes
    ----------
    classes_, n_features_in_
    feature_names_in_ : ndarray of str, set when X has string column names (a DataFrame), as in
        scikit-learn; prediction checks them
    inducing_points_ : (m, d) array, or a list of them (one-vs-rest)
    kernel_ : the fitted kernel, or a list (one-vs-rest)
    log_marginal_likelihood_value_ : log Z_q (eq. (3)) at the last step; for minibatch training
        the last epoch's estimate over all n rows, the mean of its minibatches' estimates (each
        one's data terms scaled by ``n/|M|``), which ``history_`` records as the epoch's objective
        (during an epoch: the mean of its steps so far); the sum over the one-vs-rest problems
    n_iter_ : int, epochs completed (L-BFGS-B fits: evaluations that could be evaluated)
    history_ : list of dicts, one per epoch: ``iteration``, ``seconds``, ``objective`` (log Z_q),
        ``reverted`` (failed steps so far) and, with ``validation_data``, ``val_error`` and
        ``val_nll``.

    Notes
    -----
    A KeyboardInterrupt during ``fit`` stops training and keeps the model of the last completed
    step (a warning is issued); ``partial_fit`` continues from it.  Before the first completed
    step of every problem (L-BFGS-B: its first evaluation) there is no model: the estimator is
    left unfitted and the KeyboardInterrupt is raised.  A fit that raises an error leaves the
    model of its last completed step, or an unfitted estimator if it completed none
    (docs/reliability.md, "Fitted states and interrupts").

    Examples
    --------
    >>> import numpy as np
    >>> from gpc import SparseGaussianProcessClassifier
    >>> from gpc.datasets import load_banana
    >>> X, y = load_banana(return_X_y=True)
    >>> clf = SparseGaussianProcessClassifier(n_inducing=16, max_iter=20, random_state=0,
    ...                                       progress=False).fit(X[:500], y[:500])
    >>> clf.inducing_points_.shape
    (16, 2)
    >>> bool(clf.history_[-1]["objective"] > clf.history_[0]["objective"])
    True
    >>> bool(clf.score(X[1000:2000], y[1000:2000]) > 0.8)
    True
    """

    def __init__(self, kernel=None, n_inducing=100, inducing_points="kmeans", method="ep",
                 likelihood="probit", batch_size="auto", max_iter="auto", learning_rate=1.0,
                 damping=None, optimize_inducing=True, tied_sites=False, jitter=1e-8,
                 validation_data=None, progress=True, random_state=None, verbose=False,
                 client=None, n_jobs=None, on_negative=DEFAULT_ON_NEGATIVE, precision="float64"):
        self.kernel = kernel
        self.n_inducing = n_inducing
        self.inducing_points = inducing_points
        self.method = method
        self.likelihood = likelihood
        self.batch_size = batch_size
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.damping = damping
        self.optimize_inducing = optimize_inducing
        self.tied_sites = tied_sites
        self.jitter = jitter
        self.validation_data = validation_data
        self.progress = progress
        self.random_state = random_state
        self.verbose = verbose
        self.client = client
        self.n_jobs = n_jobs
        self.on_negative = on_negative
        self.precision = precision

    # -- the hooks of SparseEstimator ----------------------------------------------------------------
    _fitted_attribute = "_problems"
    _FLAGS = ("optimize_inducing", "tied_sites")

    def _check_params(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        Rule("ep", self.on_negative)                  # a ValueError naming on_negative
        self._check_training_params()
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.precision == "mixed" and (self.method not in ("ep", "pl") or self.tied_sites
                                          or self.client is not None):
            raise ValueError("precision='mixed' runs minibatch SEP with per-row sites only "
                             "(method 'ep' or 'pl', tied_sites=False, client=None); use "
                             "precision='float64'")
        if self.tied_sites and self.method != "ep":
            raise ValueError("tied_sites=True needs method='ep'")
        if self.method == "gfitc" and self.batch_size not in (None, "auto"):
            raise ValueError("method='gfitc' trains in batch only (its evidence is not a sum over the "
                             "data, SEP §3): use batch_size=None")
        if self.client is not None and self.method == "gfitc":
            raise ValueError("client= cannot run method='gfitc': GFITC's evidence is not a sum over "
                             "the data (SEP §3), so it does not split over workers; use "
                             "method='ep' or 'svi', or client=None")
        return get_likelihood(self.likelihood)

    def _auto_minibatches(self):
        """SEP and SVI train on minibatches from AUTO_MINIBATCH_FROM rows on; GFITC in batch."""
        return self.method != "gfitc"

    def _initial_model(self, X, rng):
        Z = initial_inducing(X, self.n_inducing, self.inducing_points, rng)
        return Z, [default_kernel(X, rng) if self.kernel is None else as_kernel(self.kernel)]

    def _new_trainer(self, X, y, likelihood, Z, kernels, rng):
        """One state per problem (one for two classes, one per class one-vs-rest), and the
        trainer of ``method`` (:mod:`gpc.sparse.core.trainers`)."""
        n, (kernel,) = X.shape[0], kernels
        states = [self._new_state(kernel, Z, n)
                  for _ in range(1 if len(self.classes_) == 2 else len(self.classes_))]
        self._problems = [(_BinarySparse(state, likelihood), None) for state in states]
        batch, n_jobs = self._batch, self._threads
        if self.tied_sites:
            return SEPTied(states, likelihood, rng, batch or BLOCK_ROWS, self._damping(False),
                           n_jobs=n_jobs)
        sep = self.method in ("ep", "pl")     # EP's or PL's rank-one sites, SEP's training
        if self.precision == "mixed" and batch is None:
            raise ValueError("precision='mixed' runs minibatch SEP only, and this fit trains in "
                             "batch (batch_size None, 'auto' below 10,000 rows, or n rows or "
                             "more): give batch_size below n, or use precision='float64'")
        if sep and batch is None:
            return SEPBatch(states, likelihood, rng, self._damping(False), n_jobs=n_jobs)
        if sep:
            return SEPMinibatch(states, likelihood, rng, batch, self._damping(True), n_jobs=n_jobs)
        if self.method == "svi" and batch is not None:
            return SVIMinibatch(states, likelihood, rng, batch, self.learning_rate, n_jobs=n_jobs)
        return LBFGSTrainer(states, likelihood, rng, n_jobs=n_jobs)

    def _new_state(self, kernel, Z, n):
        if self.method == "gfitc":
            return GFITCState(kernel, Z, n, self.jitter, self.optimize_inducing,
                              self._damping(False), on_negative=self.on_negative)
        if self.method == "svi":
            return SVIState(kernel, Z, n, self.jitter, self.optimize_inducing)
        minibatch = self._batch is not None and not self.tied_sites
        return SEPState(kernel, Z, n, self.jitter, self.optimize_inducing, self.learning_rate,
                        tied=bool(self.tied_sites), method=self.method,
                        on_negative=self.on_negative, precision=self.precision,
                        z_rate=MINIBATCH_Z_RATE if minibatch else 1.0)

    def _training_rows(self, X, y):
        """Each problem's ±1 labels (classes_[1] against classes_[0] for two classes, each class
        against the rest otherwise) on the rows, in process or on ``client``."""
        y = np.asarray(y)
        if len(self._problems) == 1:
            targets = [np.where(y == self.classes_[1], 1.0, -1.0)]
        else:
            targets = [np.where(y == c, 1.0, -1.0) for c in self.classes_]
        self._problems = [(model, t) for (model, _), t in zip(self._problems, targets)]
        if self.client is None:
            return InProcessRows(X, targets)
        from ._distributed import DistributedFit
        return EngineRows(DistributedFit(self.client, X, targets, self._trainer.states))

    # -- fitting -------------------------------------------------------------------------------
    def fit(self, X: ArrayLike, y: ArrayLike) -> "SparseGaussianProcessClassifier":
        """Initialise Z and the kernel, then train for ``max_iter`` epochs."""
        return self._fit(X, y)

    def partial_fit(self, X: ArrayLike, y: ArrayLike,
                    classes: Optional[ArrayLike] = None) -> "SparseGaussianProcessClassifier":
        """One more epoch over (X, y), continuing from the current state.

        The rows must be the training rows of the first ``fit``: each row keeps its sites between
        calls.  With ``tied_sites`` there are no per-row sites, and the rows may be new ones (a
        stream).  On an unfitted estimator the call starts a fit of one epoch; ``classes`` then
        fixes the classes (scikit-learn's meaning: every class that y may ever hold, needed when
        the first rows do not show them all) and must be the same, or None, on later calls.  An
        L-BFGS-B fit (GFITC, batch SVI) restarts the optimiser for two evaluations, of which the
        first is the point it starts from.
        """
        return self._partial_fit(X, y, classes)

    # -- fitted attributes -----------------------------------------------------------------------
    def _one_or_list(self, values):
        return values[0] if len(values) == 1 else values

    @property
    def inducing_points_(self):
        self._check_fitted()
        return self._one_or_list([m.state.Z for m, _ in self._problems])

    @property
    def kernel_(self):
        """The fitted kernel, of the kind passed in (a scikit-learn kernel stays one)."""
        self._check_fitted()
        return self._one_or_list([user_kernel(m.state.kernel) for m, _ in self._problems])

    # -- prediction ------------------------------------------------------------------------------
    def predict_latent(self, X):
        """Latent predictive mean and variance (SEP eq. (5) before the likelihood integral).

        Arrays (n,) for two classes, (n, n_classes) one-vs-rest.
        """
        self._check_fitted()
        cols = []
        for model, _ in self._problems:
            parts = self._row_blocks(X, lambda Xb, _: model.latent(Xb))
            cols.append((np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])))
        if len(cols) == 1:
            return cols[0]
        return np.column_stack([c[0] for c in cols]), np.column_stack([c[1] for c in cols])

    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Class probabilities (SEP eq. (5)); one-vs-rest normalised to sum to one."""
        self._check_fitted()
        P = np.column_stack([np.concatenate(self._row_blocks(X, lambda Xb, _: m.proba_positive(Xb)))
                             for m, _ in self._problems])
        if len(self._problems) == 1:
            return np.column_stack([1.0 - P[:, 0], P[:, 0]])
        total = P.sum(axis=1, keepdims=True)
        return P / np.where(total > 0, total, 1.0)
