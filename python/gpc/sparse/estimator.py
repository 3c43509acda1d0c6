"""``SparseGaussianProcessClassifier``: inducing-point GP classification for large n (SEP paper).

Method names.  The exact engine (``gpc.infer``, ``python -m gpc compare``) uses "sep" for
*sequential* EP, after PL Table I's labels PEP/SEP/PPL/SPL.  The sparse estimator therefore never
says "sep": its ``method`` is "ep" (the scalable EP of the SEP paper, §2), "pl" (posterior
linearisation on the same sites), "gfitc" or "svi" (the baselines of SEP §3).
"""

import time

import numpy as np
from scipy.cluster.vq import kmeans2

from .._validation import check_positive_float, check_positive_int
from ..classifier import GaussianProcessClassifier, NotFittedError, _Base, _ClassifierMixin
from ..kernels import RBF, ConstantKernel, as_kernel
from ..likelihoods import get_likelihood
from ._passes import as_block, block_ranges
from ._train import (SEPState, batch_step, iteration, minibatch_step, tied_iteration,
                     tied_minibatch_step)
from .baselines import GFITCState, SVIState, _LBFGSState
from .ep import DEFAULT_ON_NEGATIVE, Rule, posterior_predict

METHODS = ("ep", "pl", "gfitc", "svi")

#: rows used for the k-means initialisation of Z and for the median heuristic
_INIT_ROWS = 10_000
_MEDIAN_ROWS = 1_000


def median_length_scale(X, rng):
    """The median distance between rows of a subsample (the median heuristic), 1.0 if it is 0."""
    idx = rng.choice(X.shape[0], size=min(X.shape[0], _MEDIAN_ROWS), replace=False)
    S = as_rows(X, np.sort(idx))
    sq = np.sum(S * S, axis=1)
    D2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * S @ S.T, 0.0)
    med = float(np.sqrt(np.median(D2[np.triu_indices(len(S), 1)]))) if len(S) > 1 else 0.0
    return med if med > 0 else 1.0


def as_rows(X, idx):
    """Rows ``idx`` (sorted) of any row-indexable array, as float64."""
    rows = X[idx]
    if hasattr(rows, "compute"):
        rows = rows.compute()
    return np.ascontiguousarray(rows, dtype=np.float64)


def initial_inducing(X, m, how, rng):
    """Z (m x d): k-means (scipy's kmeans2, k-means++ seeds) on a subsample, or random rows."""
    n = X.shape[0]
    if not isinstance(how, str):
        Z = np.asarray(how, dtype=np.float64)
        if Z.ndim != 2 or Z.shape[1] != X.shape[1] or not np.all(np.isfinite(Z)):
            raise ValueError(f"inducing_points must be a finite (m, {X.shape[1]}) array, got shape "
                             f"{Z.shape}")
        return Z.copy()
    if how not in ("kmeans", "random"):
        raise ValueError(f"inducing_points must be 'kmeans', 'random' or an array, got {how!r}")
    m = min(m, n)
    if how == "random":
        return as_rows(X, np.sort(rng.choice(n, size=m, replace=False)))
    sample = as_rows(X, np.sort(rng.choice(n, size=min(n, max(_INIT_ROWS, m)), replace=False)))
    if m == len(sample):
        return sample
    Z, _ = kmeans2(sample, m, minit="++", seed=rng)
    return Z


class _Progress:
    """A tqdm bar over the training steps when asked for and tqdm is installed; else nothing."""

    def __init__(self, enabled, total):
        self.bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:       # tqdm is an optional extra
                return
            self.bar = tqdm(total=total, desc="sparse GP fit", leave=False)

    def update(self, k=1):
        if self.bar is not None:
            self.bar.update(k)

    def close(self):
        if self.bar is not None:
            self.bar.close()


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


class SparseGaussianProcessClassifier(_ClassifierMixin, _Base):
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
        m, the number of inducing points (at most n).
    inducing_points : "kmeans", "random" or array (m, d), default "kmeans"
        k-means (scipy) on a subsample of at most 10,000 rows, random rows, or given points.
    method : "ep", "pl", "gfitc" or "svi", default "ep"
        "ep" is the scalable EP of the SEP paper (not "sep": gpc's exact engine uses that name
        for *sequential* EP).  "pl": posterior linearisation (PL paper eq. (9)-(18)) on the same
        rank-one sites and the same training, each site the statistical linear regression of its
        label on a_iᵀw under q (never a negative site); its log Z_q is PL eq. (18) for the sparse
        model and its gradient that of the linearised model's evidence (docs/sparse.md).  "gfitc": EP on the FITC prior run to convergence (tol 1e-6) at
        every (θ, Z), with L-BFGS-B on its evidence; batch only.  "svi": the bound (8) with a
        whitened q(u) = N(μ, L_q L_qᵀ), by L-BFGS-B in batch or Adadelta on minibatches.  See
        :mod:`gpc.sparse.baselines`.
    likelihood : "probit", "logit", "noisy_threshold" or a Likelihood, default "probit"
    on_negative : "clip", "raise", "skip" or "pl", default: that of the exact EP (``gpc.infer``)
        Methods "ep" and "gfitc": what a site update meets with a negative cavity or site
        variance does, as in the exact EP (non-log-concave likelihoods such as the noisy
        threshold): "raise" keeps negative sites and raises NegativeVarianceError at a cavity
        that is not a distribution; "clip" sets a negative site precision to 1e-8; "skip" keeps
        the old site; "pl" takes PL's update for that site.  ``n_fixed`` of each problem's state
        counts the updates so handled.
    batch_size : int or None, default None
        None trains in batch (parallel site passes over all rows, one inner step per pass);
        an int trains on minibatches of that many rows (eq. (6), stochastic step scaled by ``n/|M|``).
    max_iter : int, default 100
        Epochs (passes over the data), batch or minibatch.  For the L-BFGS-B fits (GFITC, batch
        SVI) it is the number of objective evaluations (for GFITC each one a converged EP).
    learning_rate : float, default 1.0
        Adadelta's step multiplier (ρ = 0.9, ε = 1e-5).  A step that fails is undone and this is
        halved (counted in ``history_``).  Under minibatch noise Adadelta's steps grow with the
        number of steps, so runs of thousands of minibatches per epoch end nearer the optimum
        with 0.1 (the sparse guide); short runs learn faster with 1.
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
        ``batch_size`` rows (4096 when None).
    jitter : float, default 1e-8
        Added to K_uu's diagonal, relative to its mean diagonal.
    validation_data : (X_val, y_val) or None
        Held-out data scored after every epoch into ``history_`` (error and mean NLL).
    progress : bool, default True
        A tqdm progress bar over the training steps while ``fit`` runs (when tqdm, an optional
        extra, is installed; it disappears when the fit ends).  False turns it off.
    random_state : int, Generator or None
        Seeds the inducing-point initialisation and the minibatch order.
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

    Attributes
    ----------
    classes_, n_features_in_
    inducing_points_ : (m, d) array, or a list of them (one-vs-rest)
    kernel_ : the fitted kernel, or a list (one-vs-rest)
    log_marginal_likelihood_value_ : log Z_q (eq. (3)) at the last step (minibatch: the last
        stochastic estimate); the sum over the one-vs-rest problems
    n_iter_ : int, epochs completed
    history_ : list of dicts, one per epoch: ``iteration``, ``seconds``, ``objective`` (log Z_q),
        ``reverted`` (failed steps so far) and, with ``validation_data``, ``val_error`` and
        ``val_nll``.

    Notes
    -----
    A KeyboardInterrupt during ``fit`` stops training and keeps the model of the last completed
    step (a warning is issued); ``partial_fit`` continues from it.

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
                 likelihood="probit", batch_size=None, max_iter=100, learning_rate=1.0,
                 damping=None, optimize_inducing=True, tied_sites=False, jitter=1e-8,
                 validation_data=None,
                 progress=True, random_state=None, verbose=False, client=None,
                 on_negative=DEFAULT_ON_NEGATIVE):
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
        self.on_negative = on_negative

    # -- checks --------------------------------------------------------------------------------
    def _check_X(self, X, fitting):
        if hasattr(X, "toarray") or hasattr(X, "tocsr"):
            raise TypeError("sparse input is not supported: pass a dense array (X.toarray())")
        if not (isinstance(X, np.ndarray) or hasattr(X, "compute")):
            X = np.asarray(X)     # lists, DataFrames; NumPy, np.memmap and Dask stay lazy
        if getattr(X, "dtype", None) is not None and X.dtype.kind not in "biuf":
            X = np.asarray(X)
            if X.dtype.kind == "c":
                raise ValueError("Complex data not supported")
            try:
                X = X.astype(np.float64)
            except ValueError as exc:    # a TypeError (a dict in an object array) propagates
                raise ValueError(f"X must be numeric: {exc}") from None
        if len(X.shape) != 2:
            raise ValueError(f"Expected 2D array, got {len(X.shape)}D array instead. Reshape your "
                             "data to (n_samples, n_features)")
        if X.shape[0] == 0:
            raise ValueError(f"Found array with 0 sample(s) (shape={X.shape}) while a minimum of 1 "
                             "is required.")
        if X.shape[1] == 0:
            raise ValueError(f"Found array with 0 feature(s) (shape={X.shape}) while a minimum of 1 "
                             "is required.")
        if not fitting and X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but {type(self).__name__} is expecting "
                             f"{self.n_features_in_} features as input")
        return X

    def _check_y(self, y, n):
        return GaussianProcessClassifier._check_y(self, y, n)

    def _check_params(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        Rule("ep", self.on_negative)                  # a ValueError naming on_negative
        check_positive_int(self.n_inducing, "n_inducing")
        check_positive_int(self.max_iter, "max_iter")
        if self.batch_size is not None:
            check_positive_int(self.batch_size, "batch_size")
        check_positive_float(self.learning_rate, "learning_rate")
        if self.tied_sites and self.method != "ep":
            raise ValueError("tied_sites=True needs method='ep'")
        if self.method == "gfitc" and self.batch_size is not None:
            raise ValueError("method='gfitc' trains in batch only (its evidence is not a sum over the "
                             "data, SEP §3): use batch_size=None")
        if self.client is not None:
            self._check_distributable()
        check_positive_float(self.jitter, "jitter", allow_zero=True)
        if self.damping is not None:
            d = check_positive_float(self.damping, "damping")
            if d > 1:
                raise ValueError(f"damping must be in (0, 1], got {self.damping!r}")
        return get_likelihood(self.likelihood)

    def _damping(self, per_row_minibatch):
        if self.damping is not None:
            return self.damping
        return 1.0 if per_row_minibatch else 0.5

    def _check_distributable(self):
        if self.method == "gfitc":
            raise ValueError("client= cannot run method='gfitc': GFITC's evidence is not a sum over "
                             "the data (SEP §3), so it does not split over workers; use "
                             "method='ep' or 'svi', or client=None")

    def _rng(self):
        rs = self.random_state
        if isinstance(rs, np.random.Generator):
            return rs
        if isinstance(rs, np.random.RandomState):
            return np.random.default_rng(rs.randint(2 ** 31))
        return np.random.default_rng(rs)

    def _check_fitted(self):
        if not hasattr(self, "_problems"):
            raise NotFittedError(f"This {type(self).__name__} instance is not fitted yet. Call 'fit' "
                                 "with appropriate arguments before using this estimator.")

    # -- fitting -------------------------------------------------------------------------------
    def fit(self, X, y):
        """Initialise Z and the kernel, then train for ``max_iter`` epochs."""
        X = self._check_X(X, fitting=True)
        y = self._check_y(y, X.shape[0])
        likelihood = self._check_params()
        classes, y_index = np.unique(y, return_inverse=True)
        if len(classes) < 2:
            raise ValueError(f"only one class ({classes[0]!r}) is present in y; GP classification "
                             "needs at least two classes")
        self.classes_, self.n_features_in_ = classes, X.shape[1]
        rng = self._rng()
        self._rng_ = rng
        Z = initial_inducing(X, self.n_inducing, self.inducing_points, rng)
        if self.kernel is None:
            kernel = ConstantKernel(1.0) * RBF(median_length_scale(X, rng))
        else:
            kernel = as_kernel(self.kernel)
        targets = [y_index == 1] if len(classes) == 2 else [y_index == k for k in range(len(classes))]
        self._problems = [(_BinarySparse(self._new_state(kernel, Z, X.shape[0]), likelihood),
                           np.where(t, 1.0, -1.0)) for t in targets]
        self.history_ = []
        self._start = time.perf_counter()
        self._train(X, self.max_iter)
        return self

    def _new_state(self, kernel, Z, n):
        if self.method == "gfitc":
            return GFITCState(kernel, Z, n, self.jitter, self.optimize_inducing,
                              self._damping(False), on_negative=self.on_negative)
        if self.method == "svi":
            return SVIState(kernel, Z, n, self.jitter, self.optimize_inducing)
        return SEPState(kernel, Z, n, self.jitter, self.optimize_inducing, self.learning_rate,
                        tied=bool(self.tied_sites), method=self.method,
                        on_negative=self.on_negative)

    def partial_fit(self, X, y, classes=None):
        """One more epoch over (X, y), continuing from the current state.

        The rows must be the training rows of the first ``fit`` (or, on an unfitted estimator,
        they start a fit of one epoch): each row keeps its sites between calls.  An L-BFGS-B fit
        (GFITC, batch SVI) restarts the optimiser for two evaluations.
        """
        if not hasattr(self, "_problems"):
            max_iter = self.max_iter
            try:
                self.max_iter = 1
                return self.fit(X, y)
            finally:
                self.max_iter = max_iter
        X = self._check_X(X, fitting=False)
        y = self._check_y(y, X.shape[0])
        state = self._problems[0][0].state
        if getattr(state, "tied", False):
            self._stream(X, y)
            return self
        if X.shape[0] != len(self._problems[0][1]):
            raise ValueError(f"partial_fit continues the fit of {len(self._problems[0][1])} rows "
                             f"(its sites are per row); got {X.shape[0]} rows")
        unknown = np.setdiff1d(np.unique(y), self.classes_)
        if len(unknown):
            raise ValueError(f"y has classes {unknown!r} not seen by fit")
        self._train(X, 2 if isinstance(self._problems[0][0].state, _LBFGSState) else 1)
        return self

    def _train(self, X, epochs):
        n = X.shape[0]
        minibatch = self.batch_size is not None and self.batch_size < n
        rows = self.batch_size if minibatch else 4096
        blocks = block_ranges(n, rows)
        steps_per_epoch = len(blocks) if minibatch else 1
        bar = self._progress_bar(epochs, steps_per_epoch * len(self._problems))
        states = [model.state for model, _ in self._problems]
        shards = None
        interrupted = False
        try:
            if self.client is not None:
                from ._distributed import DistributedFit
                shards = DistributedFit(self.client, X, [yy for _, yy in self._problems], states)
            if isinstance(states[0], _LBFGSState) and not minibatch:
                for k, (model, yy) in enumerate(self._problems):
                    data = X if shards is None else shards.rows(k, model.likelihood, rows)
                    model.state.run(model.likelihood, data, yy, epochs,
                                    lambda value: (bar.update(), self._record(value)), rows)
                epochs = 0
            for _ in range(epochs):
                objective = 0.0
                for k, (model, yy) in enumerate(self._problems):
                    if shards is None:
                        objective += self._epoch(model, X, yy, minibatch, blocks, rows, bar)
                    else:
                        objective += self._shard_epoch(shards, k, model, minibatch, rows, bar)
                self._record(objective)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            bar.close()
            if shards is not None:
                shards.finish(states)      # the sites come home: partial_fit can continue
        if interrupted:
            import warnings
            warnings.warn("fit interrupted: the model keeps its last completed step",
                          RuntimeWarning, stacklevel=3)

    def _progress_bar(self, epochs, steps_per_epoch):
        """What ``_train`` tells of each step (``update()``) and of the end (``close()``): a tqdm bar
        with ``progress``; the experiments score held-out rows there between epochs."""
        return _Progress(self.progress, epochs * steps_per_epoch)

    def _shard_epoch(self, shards, k, model, minibatch, rows, bar):
        """One epoch of problem k on the engine's shards (``client=``): the in-process epoch's steps,
        each worker taking its share of every minibatch (``_distributed.minibatch_plan``) and
        keeping the directions of its own rows' sites."""
        state, lik = model.state, model.likelihood
        if not minibatch and not getattr(state, "tied", False):
            value = iteration(state, shards.rows(k, lik, rows), self._damping(False))
            bar.update()
            return value
        plan = shards.plan(rows)
        if isinstance(state, SEPState) and not state.tied:
            shards.start_minibatches(state, k, 4096)
        values = []
        for j in self._rng_.permutation(len(plan)):
            batch = shards.rows(k, lik, rows, plan[j])
            if isinstance(state, SVIState):
                values.append(state.minibatch_step(lik, batch, shards.batch_labels(k, plan[j]),
                                                   shards.engine.n_rows, self.learning_rate))
            elif state.tied:
                values.append(tied_iteration(state, batch, self._damping(False)))
            else:
                values.append(iteration(state, batch, self._damping(True)))
            bar.update()
        return float(np.mean(values))

    def _epoch(self, model, X, y, minibatch, blocks, rows, bar):
        state, n, lik = model.state, len(y), model.likelihood
        if getattr(state, "tied", False):
            def step(Xb, start, stop):
                return tied_minibatch_step(state, lik, Xb, y[start:stop], self._damping(False))
        elif not minibatch:
            value = batch_step(state, lik, X, y, self._damping(False), rows)
            bar.update()
            return value
        elif isinstance(state, SVIState):
            def step(Xb, start, stop):
                return state.minibatch_step(lik, Xb, y[start:stop], n, self.learning_rate)
        else:
            state.start_minibatches(X, 4096)

            def step(Xb, start, stop):
                return minibatch_step(state, lik, Xb, y[start:stop], slice(start, stop), n,
                                      self._damping(True))
        values = []
        for k in self._rng_.permutation(len(blocks)):
            start, stop = blocks[k]
            values.append(step(as_block(X, start, stop), start, stop))
            bar.update()
        return float(np.mean(values))

    def _stream(self, X, y):
        """Tied sites: one step per block of the given rows, which need not be the fit's rows."""
        y = np.asarray(y)
        rows = self.batch_size or 4096
        targets = [np.where(y == (self.classes_[1] if len(self._problems) == 1 else c), 1.0, -1.0)
                   for c in self.classes_[:len(self._problems)]]
        shards = None
        if self.client is not None:
            from ._distributed import DistributedFit
            shards = DistributedFit(self.client, X, targets, [m.state for m, _ in self._problems])
        damping = self._damping(False)
        objective = 0.0
        try:
            for k, ((model, _), yy) in enumerate(zip(self._problems, targets)):
                if shards is None:
                    values = [tied_minibatch_step(model.state, model.likelihood, as_block(X, a, b),
                                                  yy[a:b], damping)
                              for a, b in block_ranges(X.shape[0], rows)]
                else:           # the blocks in order, each worker taking its share
                    values = [tied_iteration(model.state, shards.rows(k, model.likelihood, rows,
                                                                      batch), damping)
                              for batch in shards.plan(rows)]
                objective += float(np.mean(values))
        finally:
            if shards is not None:
                shards.finish([])       # tied sites: nothing per row to bring home
        self._record(objective)

    def _validation_scores(self):
        """(error, mean negative log predictive probability) on ``validation_data``."""
        Xv, yv = self.validation_data
        proba = self.predict_proba(Xv)
        index = np.searchsorted(self.classes_, np.asarray(yv))
        p = proba[np.arange(len(index)), np.clip(index, 0, len(self.classes_) - 1)]
        return (float(np.mean(self.classes_[np.argmax(proba, axis=1)] != yv)),
                float(-np.mean(np.log(np.maximum(p, 1e-300)))))

    def _record(self, objective):
        states = [m.state for m, _ in self._problems]
        entry = {"iteration": len(self.history_) + 1,
                 "seconds": time.perf_counter() - self._start,
                 "objective": objective,
                 "reverted": sum(s.reverted for s in states)}
        if self.validation_data is not None:
            entry["val_error"], entry["val_nll"] = self._validation_scores()
        self.history_.append(entry)
        if self.verbose:
            print(", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in entry.items()))

    # -- fitted attributes -----------------------------------------------------------------------
    def _one_or_list(self, values):
        return values[0] if len(values) == 1 else values

    @property
    def inducing_points_(self):
        self._check_fitted()
        return self._one_or_list([m.state.Z for m, _ in self._problems])

    @property
    def n_iter_(self):
        """Epochs completed (``fit`` and ``partial_fit`` together)."""
        self._check_fitted()
        return len(self.history_)

    @property
    def kernel_(self):
        self._check_fitted()
        return self._one_or_list([m.state.kernel for m, _ in self._problems])

    @property
    def log_marginal_likelihood_value_(self):
        self._check_fitted()
        return float(sum(m.state.log_z for m, _ in self._problems))

    # -- prediction ------------------------------------------------------------------------------
    def _latent_blocks(self, X, fn):
        X = self._check_X(X, fitting=False)
        out = [fn(as_block(X, a, b)) for a, b in block_ranges(X.shape[0], 4096)]
        return out

    def predict_latent(self, X):
        """Latent predictive mean and variance (SEP eq. (5) before the likelihood integral).

        Arrays (n,) for two classes, (n, n_classes) one-vs-rest.
        """
        self._check_fitted()
        cols = []
        for model, _ in self._problems:
            parts = self._latent_blocks(X, model.latent)
            cols.append((np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])))
        if len(cols) == 1:
            return cols[0]
        return np.column_stack([c[0] for c in cols]), np.column_stack([c[1] for c in cols])

    def predict_proba(self, X):
        """Class probabilities (SEP eq. (5)); one-vs-rest normalised to sum to one."""
        self._check_fitted()
        P = np.column_stack([np.concatenate(self._latent_blocks(X, m.proba_positive))
                             for m, _ in self._problems])
        if len(self._problems) == 1:
            return np.column_stack([1.0 - P[:, 0], P[:, 0]])
        total = P.sum(axis=1, keepdims=True)
        return P / np.where(total > 0, total, 1.0)

    def predict(self, X):
        """The class with the largest predictive probability."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]

    def __sklearn_clone__(self):
        """scikit-learn's ``clone``, sharing ``client``: a live connection is not copied (deep-copying a
        dask Client fails), so clones, e.g. in a grid search, train on the same cluster."""
        from sklearn.base import clone

        params = self.get_params(deep=False)
        return type(self)(**{name: value if name == "client" else clone(value, safe=False)
                             for name, value in params.items()})

    def __getstate__(self):
        """Pickle without ``client``: a connection cannot be saved; the unpickled model has
        ``client=None`` and predicts (and continues with ``partial_fit``) in process."""
        state = dict(super().__getstate__())
        state["client"] = None
        return state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        return tags
