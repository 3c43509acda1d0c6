"""``SparseMultiClassGPC``: robust multi-class GP classification on inducing points, scalable EP."""

from functools import partial
from typing import Optional

import numpy as np
from numpy.typing import ArrayLike

from .._parallel import BLOCK_ROWS
from .._validation import check_positive_float
from ..kernels import as_kernel, user_kernel
from ..sparse.base import SparseEstimator
from ..sparse.core.steps import STEP_RULES
from ..sparse.core.trainers import SEPBatch, SEPMinibatch, SEPTied
from ..sparse.estimator import default_kernel, initial_inducing
from ._sparse_distributed import EngineClassRows, MultiClassShards
from .estimator import LABEL_NOISE_BOUNDS, check_label_noise, check_label_noise_classes
from .predict import N_NODES, argmax_probabilities
from .sparse import (ArgmaxLikelihood, MultiClassRows, SparseMultiClassState, Tasks,
                     latent_moments, row_outlier_probability)
from .sparse_vi import SparseMultiClassVIState, VIBatch, VIMinibatch

MODELS = ("robust", "standard")
METHODS = ("ep", "vi")
#: bytes of temporaries a prediction may hold at once besides its (n, C) results: rows are
#: predicted in blocks whose whitened rows and argmax integrals each fit this
PREDICT_BYTES = 64 * 2 ** 20


def latent_block_rows(state):
    """Rows per block of the latent moments: each row holds its whitened rows a_ik (one m-vector
    per distinct class factor, with the whitening's kernel row and product: three) and every
    class's marginal rows (one m-vector per class), 8 bytes each; at most BLOCK_ROWS."""
    distinct = {id(f): f.m for f in state.factors}
    per_row = 8 * (3 * sum(distinct.values()) + sum(f.m for f in state.factors))
    return int(min(BLOCK_ROWS, max(1, PREDICT_BYTES // per_row)))


def proba_block_rows(n_classes):
    """Rows per call of :func:`gpc.multiclass.predict.argmax_probabilities`, whose Gauss–Hermite
    rule holds two (rows, C, C, N_NODES) float64 arrays and three of (rows, C, N_NODES):
    8 N_NODES C (2C + 3) bytes a row (at C = 50, 2.6 MB)."""
    per_row = 8 * N_NODES * n_classes * (2 * n_classes + 3)
    return int(max(1, PREDICT_BYTES // per_row))


class SparseMultiClassGPC(SparseEstimator):
    """Robust multi-class GP classification with m inducing points per class, by scalable EP.

    RMGPC's model (RMGPC eq. (2)-(5)) on inducing points: C latent functions f_k with independent
    GP priors, each carried by its inducing values u_k = f_k(Z_k) and the FITC conditional
    f_k(xᵢ) | u_k ~ N(k_iᵀK_uu⁻¹u_k, s_ik) (SEP eq. (1), per class); the label is the argmax of the
    f_k(xᵢ) unless the outlier indicator zᵢ = 1 makes it uniform, zᵢ ~ Bern(ρ).  EP approximates
    the posterior by Q = Bern(z) [Beta(ρ)] Π_k N(u_k) (RMGPC eq. (13)) with, per point and class
    k ≠ yᵢ, a pair site rank one in u_yᵢ and in u_k (RMGPC eq. (14) in u-space); the FITC variances
    widen each pair's argmax step.  The evidence is a sum over the data (SEP eq. (3)), so
    hyperparameters, Z and ε follow its gradient (SEP eq. (4), minibatch eq. (6)) by Adadelta
    (or per-parameter adaptive rates, ``step_rule``) after each site pass or minibatch (SEP
    §2.3).  This is the method of Villacampa-Calvo and Hernández-Lobato, "Scalable Multi-Class
    Gaussian Process Classification using Expectation Propagation" (ICML 2017), with RMGPC's
    Beta-distributed outlier rate as a further choice; the maths is
    docs/derivations-sparse-multiclass.md.  With Z = X (m = n) and no jitter it is
    :class:`gpc.MultiClassGPC` (model="robust") exactly.

    Time O(n C m²) per epoch; memory 5 C + 3 numbers per row and O(C m²), for minibatch training
    also m float32 per row and class (each site's direction, SEP §2.3), and with tied sites
    O(C m²) in all.

    ``method="vi"`` is the paper's variational comparison instead of EP: the same likelihood with
    fixed (or learnt) ε, q(u_k) Gaussian per class, and the bound Σᵢ E_q[log p(yᵢ | fᵢ)] − Σ_k KL
    with the expectations by one-dimensional Gauss–Hermite quadrature (Hensman et al. 2015's
    robust-max; :mod:`gpc.multiclass.sparse_vi`, derivation §11), trained by L-BFGS-B in batch or
    Adadelta on minibatches, as :class:`gpc.SparseGaussianProcessClassifier`'s "svi".  It keeps
    nothing per row: O(C m²) memory whatever n.

    Parameters
    ----------
    kernel : gpc or scikit-learn kernel, or a list of C of them, optional
        Default: ConstantKernel(1.0) * RBF(median distance of a subsample) for every class.
        Fixed bounds ("fixed") hold a hyperparameter.  One kernel is cloned for every class
        unless ``shared_kernel``; a list gives each class its own.
    n_inducing : int, default 100
        m, the inducing points of each class.  With ``inducing_points`` "kmeans" or "random", an
        m above the n training rows warns and uses n (as scikit-learn's ``Nystroem`` does).
    inducing_points : "kmeans", "random", array (m, d) or array (C, m, d), default "kmeans"
        As for :class:`gpc.SparseGaussianProcessClassifier`: every class starts at the same points;
        or, C arrays (m, d) (one per class, in ``classes_`` order), each class at its own.
    method : "ep" or "vi", default "ep"
        "ep": scalable EP (above).  "vi": the variational bound (above), which needs
        ``label_noise=ε``: the noiseless argmax (model="standard") has log p = −∞ on a set of
        positive mass under q, and the Beta treatment is EP's; ``tied_sites``, ``damping``,
        ``a0``, ``b0`` and ``client`` are EP's.  ``max_iter`` counts L-BFGS-B's evaluations of the
        bound in batch.
    shared_kernel : bool, default False
        One set of hyperparameters for all classes (their gradients added).
    shared_inducing : bool, default False
        One set of inducing inputs Z for all classes (their gradients added); with
        ``shared_kernel`` the classes share K_uu and each row block is whitened once.
    model : "robust" or "standard", default "robust"
        "robust": RMGPC's outlier indicators.  "standard": no outliers (SMGPC's likelihood, ρ = 0);
        latent noise, if wanted, is a WhiteKernel term, which enters the FITC variances.
    label_noise : "beta" or float, default "beta"
        model="robust" only.  "beta": ρ ~ Beta(a0, b0) with a Beta posterior (RMGPC eq. (3)-(4),
        (15)).  A float ε in (0, (C − 1)/C): fixed label noise, the likelihood (1 − ε) pᵢ +
        ε/(C − 1)(1 − pᵢ) of the ICML 2017 paper (ρ = Cε/(C − 1)); its starting value when learnt.
    label_noise_bounds : (float, float) or "fixed", default (1e-6, 0.4)
        Bounds of ε when it is learnt (log ε follows the evidence gradient), or "fixed".
    a0, b0 : float, default 1.0, 9.0
        The Beta prior of ρ (label_noise="beta"; RMGPC's suggestion).
    batch_size : int, None or "auto", default "auto"
        None: batch training (parallel site passes over all rows, one inner step per pass); an int
        below n: minibatches of that many rows (SEP eq. (6), data terms scaled by ``(rows q
        holds) / |M|``).  "auto": batch below 10,000 rows, minibatches of 2,000 from there on.
        Minibatches are random subsets of the rows: each epoch draws a permutation of the rows
        (``random_state``) and cuts it into minibatches, read in row order, so class-sorted rows
        train as shuffled ones and every row is seen once per epoch.
    max_iter : int or "auto", default "auto"
        Epochs; "auto" as in :class:`gpc.SparseGaussianProcessClassifier` (batch EP: until no
        pass moves a site by more than 1e-8, within 1000 passes at fixed parameters, else 100).
    learning_rate : float, default 1.0
        The step multiplier of ``step_rule``; a step that fails is undone and this is halved.
    step_rule : "adadelta", "adaptive" or callable, default "adadelta"
        method="ep": how the parameters step after each site pass or minibatch.  "adadelta":
        Adadelta (Zeiler 2012), whose steps do not scale with the gradient.  "adaptive": one rate
        per parameter, step η_j g_j, η_j from 0.01 multiplied by 1.02 (at most 1) while g_j keeps
        its sign and by 0.5 when it flips (:class:`gpc.sparse.core.steps.AdaptiveRates`, the
        ICML 2017 authors' batch code): in batch the gradient sums over the rows, so its steps
        grow with n.  A callable is called as ``step_rule(n_params, lr=learning_rate)`` and
        returns the optimiser: an object whose ``step(g)`` gives the step for the gradient g of
        log Z over the packed parameters (every class's log θ in ``kernel.theta`` order, then
        every class's Z, then log ε when it is learnt) and whose attribute ``lr`` is halved when a
        step fails.  method="vi" trains by L-BFGS-B (or ``optimizer``) in batch and Adadelta on
        minibatches.
    damping : float in (0, 1] or None, default None
        New site = damping · matched + (1 − damping) · old; None: 0.5 (RMGPC §3's value) in every
        schedule (undamped minibatch updates with per-row sites oscillated on ten classes,
        docs/reproduction-smgpc.md).  A site update that leaves some q_k without a factor is
        dropped and the damping of later ones halved.
    damping_decay : float in (0, 1], default 1.0
        method="ep": the damping is multiplied by this after every epoch (the ICML 2017 authors'
        batch code anneals it by 0.99 a pass); 1 keeps it constant.
    optimize_inducing : bool, default True
        Move Z along the gradient too.
    tied_sites : bool, default False
        One shared average site per class (stochastic EP, derivation §7): O(C m²) memory whatever
        n, each point's sites fitted by a local EP against the tied cavity in every step, and
        ``partial_fit`` takes any rows (a stream).  Needs ``label_noise=ε`` or model="standard":
        the Beta posterior's ψ̃ᵢ would need a tied average of their own, which is not derived.
        Training rows' outlier probabilities: :meth:`outlier_probability`.
    jitter : float, default 1e-8
        Added to each K_uu's diagonal, relative to its mean diagonal.
    validation_data : (X_val, y_val) or None
        Held-out data scored after every epoch into ``history_`` (error and mean NLL).
    progress : bool, default True
        A tqdm progress bar while ``fit`` runs (when tqdm is installed).
    random_state : int, Generator or None
        Seeds the inducing points, the median heuristic and the minibatches: the same seed gives
        the same fit, bit for bit, for every ``n_jobs``.
    verbose : bool, default False
        Print one line per epoch.
    client : dask.distributed.Client, a gpc.distributed engine, or None, default None
        Batch training with the rows and their sites on a cluster's workers (SEP §2.3; see
        :class:`gpc.SparseGaussianProcessClassifier`); each step sends every q_k out and gets
        O(C m²) sums back.  Minibatches and tied sites train in process only.  Under the Beta
        treatment the shards refine their ψ̃ᵢ in parallel (in turn within a shard), each of K
        shards moving them by 1/K of its change, so Q's Beta stays proper: the same fixed points
        as in process, where all of them are refined in turn.
        ``gpc.distributed.InProcessEngine(n_shards=K)`` runs the shards in this process.
    n_jobs : int or None, default None
        Threads over the classes' blocks and the ranges of points of each step, with joblib's
        convention (None: as many as BLAS may use; -1 every core, -2 all but one, k > 0 exactly
        k).  BLAS runs on one thread per call while the estimator trains or predicts
        (gpc._parallel.block_threads), and every sum is taken in a fixed order, so the fitted
        model and its predictions are the same bits for every n_jobs.
    whiten : bool, default True
        method="vi": the coordinates of q, as GPflow's SVGP ``whiten``.  True: q(w_k) =
        N(μ_k, L_kL_kᵀ) with u_k = L_K w_k (K_uu = L_K L_Kᵀ), started at N(0, I).  False: q(u_k) =
        N(μ_k, L_kL_kᵀ) in u-space with KL[q(u_k) ‖ N(0, K_uu)] (Hensman, Matthews & Ghahramani
        2015, §3; the ICML 2017 authors' VI), started at the prior.  The bound is the same at
        corresponding q, but q stays put in w or in u while θ and Z move, so the gradient in θ and
        Z differs and L-BFGS-B or Adadelta takes another path.  EP's fixed points do not depend on
        coordinates: method="ep" ignores it.
    optimizer : "fmin_l_bfgs_b" or callable, default "fmin_l_bfgs_b"
        method="vi" in batch: what maximises the bound, as in scikit-learn's
        GaussianProcessClassifier.  A callable is called once as ``optimizer(obj_func,
        initial_theta, bounds)`` with the packed parameters (:attr:`step_rule`'s order, then every
        class's μ_k and the lower triangle of L_k by rows), their (p, 2) bounds (±inf where free)
        and ``obj_func(theta, eval_gradient=True)``, which returns minus the bound and its
        gradient; what it returns is not used: the fit stops it after ``max_iter`` evaluations
        and keeps the best point evaluated.  EP takes its steps by ``step_rule`` and minibatch VI
        by Adadelta: for them a callable is refused.

    Attributes
    ----------
    classes_, n_features_in_
    feature_names_in_ : ndarray of str, set when X has string column names (a DataFrame), as in
        scikit-learn; prediction checks them
    kernels_ : list of C fitted kernels (of the kind passed in)
    inducing_points_ : list of C (m, d) arrays, or one array with ``shared_inducing``
    label_noise_ : the fitted ε with ``label_noise=ε``; None otherwise
    outlier_rate_ : ρ: the fixed rate Cε/(C − 1), Q's mean a/(a + b) under the Beta treatment, or 0
    outlier_probability_ : Q(zᵢ = 1) of every training row in fit order (RMGPC eq. (21)); zeros for
        model="standard"; not kept with ``tied_sites`` or method="vi"
    log_marginal_likelihood_value_ : log Z (derivation §5) at the last step; for minibatch
        training the last epoch's estimate over all n rows, the mean of its minibatches'
        estimates (``history_``'s objective; during an epoch the mean of its steps so far); for
        method="vi" the variational bound (likewise on minibatches)
    n_iter_ : epochs completed
    history_ : list of dicts per epoch: ``iteration``, ``seconds``, ``objective`` (log Z),
        ``reverted`` and, with ``validation_data``, ``val_error`` and ``val_nll``

    Notes
    -----
    A KeyboardInterrupt during ``fit`` stops training and keeps the model of the last completed
    step (a warning is issued); before the first completed step there is no model: the estimator
    is left unfitted and the KeyboardInterrupt is raised.  A fit that raises an error leaves the
    model of its last completed step if that is valid (ρ in [0, 1], a proper Beta, a finite log
    Z), else an unfitted estimator (docs/reliability.md, "Fitted states and interrupts").

    Examples
    --------
    >>> import numpy as np
    >>> from gpc import SparseMultiClassGPC
    >>> from gpc.datasets import load_thyroid
    >>> data = load_thyroid(binary=False)
    >>> X = (data.X - data.X.mean(axis=0)) / data.X.std(axis=0)
    >>> clf = SparseMultiClassGPC(n_inducing=10, label_noise=0.02, max_iter=30, random_state=0,
    ...                           progress=False).fit(X, data.y)
    >>> bool(clf.score(X, data.y) > 0.9)
    True
    >>> clf.predict_proba(X[:2]).shape
    (2, 3)
    """

    def __init__(self, kernel=None, n_inducing=100, inducing_points="kmeans", method="ep",
                 shared_kernel=False, shared_inducing=False, model="robust", label_noise="beta",
                 label_noise_bounds=LABEL_NOISE_BOUNDS, a0=1.0, b0=9.0, batch_size="auto",
                 max_iter="auto", learning_rate=1.0, step_rule="adadelta", damping=None,
                 damping_decay=1.0, optimize_inducing=True, tied_sites=False, jitter=1e-8,
                 validation_data=None, progress=True, random_state=None, verbose=False,
                 client=None, n_jobs=None, whiten=True, optimizer="fmin_l_bfgs_b"):
        self.kernel = kernel
        self.n_inducing = n_inducing
        self.inducing_points = inducing_points
        self.method = method
        self.shared_kernel = shared_kernel
        self.shared_inducing = shared_inducing
        self.model = model
        self.label_noise = label_noise
        self.label_noise_bounds = label_noise_bounds
        self.a0 = a0
        self.b0 = b0
        self.batch_size = batch_size
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.step_rule = step_rule
        self.damping = damping
        self.damping_decay = damping_decay
        self.optimize_inducing = optimize_inducing
        self.tied_sites = tied_sites
        self.jitter = jitter
        self.validation_data = validation_data
        self.progress = progress
        self.random_state = random_state
        self.verbose = verbose
        self.client = client
        self.n_jobs = n_jobs
        self.whiten = whiten
        self.optimizer = optimizer

    # -- the hooks of SparseEstimator ----------------------------------------------------------------
    _fitted_attribute = "_state"
    _FLAGS = ("shared_kernel", "shared_inducing", "optimize_inducing", "tied_sites", "whiten")

    # -- checks --------------------------------------------------------------------------------
    def _noise(self):
        """The outlier treatment: "beta", "fixed" or "none" (gpc.multiclass.sparse.NOISES)."""
        if self.model == "standard":
            return "none"
        return "beta" if isinstance(self.label_noise, str) else "fixed"

    def _check_params(self):
        """Checks every parameter; returns the likelihood's noise treatment."""
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        self._check_training_params()
        if not (callable(self.step_rule)
                or isinstance(self.step_rule, str) and self.step_rule in STEP_RULES):
            raise ValueError(f"step_rule must be one of {tuple(STEP_RULES)} or a callable, "
                             f"got {self.step_rule!r}")
        if not (callable(self.optimizer) or isinstance(self.optimizer, str)
                and self.optimizer == "fmin_l_bfgs_b"):
            raise ValueError(f"optimizer must be 'fmin_l_bfgs_b' or a callable, got "
                             f"{self.optimizer!r}")
        if callable(self.optimizer) and self.method != "vi":
            raise ValueError("optimizer= maximises the bound of method='vi' in batch; "
                             "method='ep' takes its steps by step_rule")
        decay = check_positive_float(self.damping_decay, "damping_decay")
        if decay > 1:
            raise ValueError(f"damping_decay must be in (0, 1], got {self.damping_decay!r}")
        check_positive_float(self.a0, "a0")
        check_positive_float(self.b0, "b0")
        check_label_noise(self.label_noise, self.label_noise_bounds, self.model)
        if self.tied_sites and self._noise() == "beta":
            raise ValueError("tied_sites=True needs label_noise=ε (fixed label noise) or "
                             "model='standard': tied sites for the Beta-distributed outlier rate "
                             "(label_noise='beta') are not derived (docs/derivations-sparse-"
                             "multiclass.md §7)")
        if self.client is not None and self.tied_sites:
            raise ValueError("client= trains in batch: tied sites train in process (client=None)")
        if isinstance(self.kernel, (list, tuple)) and self.shared_kernel:
            raise ValueError("a list of kernels gives each class its own: shared_kernel=True "
                             "needs one kernel")
        if self.method == "vi":
            self._check_vi()
        return self._noise()

    def _check_vi(self):
        """What method="vi" cannot take: no noise or the Beta treatment, tied sites, a client."""
        if self._noise() == "none":
            raise ValueError("method='vi' with model='standard' has no variational bound (the "
                             "noiseless argmax has log-likelihood −∞ on a set of positive "
                             "probability under q): pass model='robust' with label_noise=ε")
        if self._noise() == "beta":
            raise ValueError("method='vi' with label_noise='beta': the Beta-distributed outlier "
                             "rate is EP's (RMGPC); the variational bound takes a fixed or learnt "
                             "label_noise=ε")
        if self.tied_sites:
            raise ValueError("method='vi' with tied_sites=True: tied sites are EP's (the "
                             "variational fit keeps nothing per row already)")
        if self.client is not None:
            raise ValueError("method='vi' with client=: the variational fit trains in process "
                             "(client=None)")

    def _check_label_noise(self, C):
        """ε and its bounds below (C − 1)/C (gpc.multiclass.estimator's rule), and ε inside its
        bounds when it is learnt."""
        if self._noise() != "fixed":
            return
        check_label_noise_classes(self.label_noise, self.label_noise_bounds,
                                  self._learns_noise(), C)
        if self._learns_noise():
            lo, hi = (float(b) for b in self.label_noise_bounds)
            if not lo <= self.label_noise <= hi:
                raise ValueError(f"label_noise={self.label_noise!r} starts outside "
                                 f"label_noise_bounds {self.label_noise_bounds!r}")

    def _learns_noise(self):
        return self._noise() == "fixed" and not isinstance(self.label_noise_bounds, str)

    def _auto_minibatches(self):
        """"auto" trains on minibatches from AUTO_MINIBATCH_FROM rows on, in process only."""
        return self.client is None

    def _class_index(self, y):
        """Labels as indices into ``classes_``; a ValueError for labels not seen in fit."""
        y = np.asarray(y)
        unknown = np.setdiff1d(np.unique(y), self.classes_)
        if len(unknown):
            raise ValueError(f"y has classes {unknown.tolist()} not in classes_ "
                             f"{self.classes_.tolist()}")
        return np.searchsorted(self.classes_, y).astype(np.intp)

    # -- fitting -------------------------------------------------------------------------------
    def fit(self, X: ArrayLike, y: ArrayLike) -> "SparseMultiClassGPC":
        """Initialise Z and the kernels, then train for ``max_iter`` epochs."""
        return self._fit(X, y)

    def partial_fit(self, X: ArrayLike, y: ArrayLike,
                    classes: Optional[ArrayLike] = None) -> "SparseMultiClassGPC":
        """One more epoch over (X, y), continuing from the current state.

        The rows (and labels) must be those of the first ``fit``: each point keeps its sites
        between calls.  With ``tied_sites`` there are no per-row sites and the rows may be new
        (a stream).  On an unfitted estimator the call starts a fit of one epoch; ``classes``
        then names every class y may ever hold (needed when the first rows do not show them all)
        and must be the same, or None, on later calls.
        """
        return self._partial_fit(X, y, classes)

    def _initial_model(self, X, rng):
        """Z, and one kernel (shared) or C (one per class), as gpc kernels."""
        C = len(self.classes_)
        self._check_label_noise(C)
        Z = self._initial_inducing(X, C, rng)
        if isinstance(self.kernel, (list, tuple)):
            if len(self.kernel) != C:
                raise ValueError(f"kernel is a list of {len(self.kernel)} kernels for {C} classes")
            return Z, [as_kernel(k) for k in self.kernel]
        kernel = default_kernel(X, rng) if self.kernel is None else as_kernel(self.kernel)
        return Z, [kernel] if self.shared_kernel else [kernel] * C

    def _initial_inducing(self, X, C, rng):
        """Z (m, d) for every class, or (C, m, d): one start per class, each checked as a single
        array is (:func:`initial_inducing`)."""
        how = self.inducing_points
        if isinstance(how, str):
            return initial_inducing(X, self.n_inducing, how, rng)
        try:
            Zs = np.asarray(how, dtype=np.float64)
        except (TypeError, ValueError):       # ragged, or not numbers
            raise ValueError(f"inducing_points must be one (m, {X.shape[1]}) array or {C} of "
                             f"them, one per class, as one (C, m, d) array; got "
                             f"{type(how).__name__} that is not one array of numbers") from None
        if Zs.ndim != 3:
            return initial_inducing(X, self.n_inducing, Zs, rng)
        if len(Zs) != C or not Zs.size:
            raise ValueError(f"inducing_points must be one (m, d) array or one per class, "
                             f"(C, m, d) with C = {C}; got shape {Zs.shape}")
        if self.shared_inducing:
            raise ValueError("shared_inducing=True takes one (m, d) array of inducing_points, "
                             "not one per class")
        return np.stack([initial_inducing(X, self.n_inducing, Z, rng) for Z in Zs])

    def _new_trainer(self, X, y, noise, Z, kernels, rng):
        """The state (every class's Z and kernel, the argmax likelihood) and its trainer."""
        if self.client is not None and self._batch is not None:
            raise ValueError("client= trains in batch: use batch_size=None (or 'auto')")
        C, n = len(self.classes_), X.shape[0]
        Zs = ([Z] if self.shared_inducing else
              list(Z) if Z.ndim == 3 else [Z.copy() for _ in range(C)])
        model = ArgmaxLikelihood(C, noise, self.a0, self.b0)
        eps = float(self.label_noise) if noise == "fixed" else None
        bounds = self.label_noise_bounds if self._learns_noise() else None
        if self.method == "vi":
            self._state = SparseMultiClassVIState(kernels, Zs, n, C, eps, bounds, self.jitter,
                                                  self.optimize_inducing, bool(self.whiten))
            if self._batch is None:
                trainer = VIBatch([self._state], model, rng)
                trainer.optimizer = None if isinstance(self.optimizer, str) else self.optimizer
                return trainer
            if callable(self.optimizer):
                raise ValueError(f"optimizer= maximises the bound in batch; these {n} rows train "
                                 f"on minibatches of {self._batch} by Adadelta (learning_rate): "
                                 f"pass batch_size=None")
            return VIMinibatch([self._state], model, rng, self._batch, self.learning_rate)
        self._state = SparseMultiClassState(
            kernels, Zs, None if self.tied_sites else self._class_index(y), n, model, self.jitter,
            self.optimize_inducing, self.learning_rate, tied=bool(self.tied_sites),
            label_noise=eps, noise_bounds=bounds, step_rule=self.step_rule)
        states = [self._state]
        if self.tied_sites:
            trainer = SEPTied(states, model, rng, self._batch or BLOCK_ROWS, self._damping(False))
        elif self._batch is None:
            trainer = SEPBatch(states, model, rng, self._damping(False))
        else:
            # damped as in batch: undamped per-row minibatch updates oscillated on ten classes
            trainer = SEPMinibatch(states, model, rng, self._batch, self._damping(False))
        trainer.damping_decay = float(self.damping_decay)
        return trainer

    def _training_rows(self, X, y):
        """The rows with their labels as class indices, in process or on ``client``."""
        y_index = self._class_index(y)
        if self._state.y is not None and not np.array_equal(self._state.y, y_index):
            raise ValueError("partial_fit continues the fit of the same labelled rows (their sites "
                             "are per row): the labels differ from the first fit's")
        if self.client is None:
            return MultiClassRows(X, y_index, Tasks())
        return EngineClassRows(MultiClassShards(self.client, X, y_index, self._state))

    def _has_model(self):
        """Whether the state holds a model whose attributes are valid: a completed step (a finite
        log Z), ρ in [0, 1] and, under the Beta treatment, a proper Beta."""
        state = self._state
        if not super()._has_model():
            return False
        if getattr(state, "model", None) is not None and state.model.beta:
            a, b = state.beta_posterior()
            if not (a > 0 and b > 0):
                return False
        return bool(0.0 <= state.rho <= 1.0)

    # -- fitted attributes -------------------------------------------------------------------------
    @property
    def kernels_(self):
        """The fitted kernel of each class, of the kind passed in."""
        self._check_fitted()
        return [user_kernel(self._state.kernel_of(k)) for k in range(len(self.classes_))]

    @property
    def inducing_points_(self):
        """Each class's inducing inputs (one array when shared)."""
        self._check_fitted()
        Zs = [self._state.Z_of(k) for k in range(len(self.classes_))]
        return Zs[0] if self.shared_inducing else Zs

    @property
    def label_noise_(self):
        self._check_fitted()
        return self._state.eps

    @property
    def outlier_rate_(self):
        self._check_fitted()
        return self._state.rho

    @property
    def outlier_probability_(self):
        """Q(zᵢ = 1) of the training rows (RMGPC eq. (21))."""
        self._check_fitted()
        if self._state.tied:
            raise AttributeError("tied sites keep no per-row state: call "
                                 "outlier_probability(X, y) for any rows")
        return self._state.outlier_probability()

    # -- prediction ------------------------------------------------------------------------------
    def _latent(self):
        """The latent moments of a block of rows, ``fn(Xb, tasks)`` → (means, variances)."""
        latent = getattr(self._state, "latent_moments", None)      # method="vi"
        return partial(latent_moments, self._state) if latent is None else latent

    def predict_latent(self, X):
        """Latent predictive means and variances of every f_k at X, (n, C) each (derivation §8):
        a_*ᵀμ_k and a_*ᵀΣ_k a_* + s_*k.  Computed in blocks of rows (:meth:`predict_proba`'s)."""
        self._check_fitted()
        latent = self._latent()
        parts = self._row_blocks(X, lambda Xb, _: latent(Xb, Tasks()),
                                 latent_block_rows(self._state))
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Class probabilities (n, C) in the order of ``classes_``: RMGPC eq. (19)-(20) with the
        sparse latent moments, ρ/C + (1 − ρ) P(argmax = c).

        Memory: the rows are predicted in blocks, so besides the (n, C) result (and X) the call
        holds at most about 64 MiB of temporaries (``PREDICT_BYTES``) whatever n: the latent
        moments of a block of rows (its whitened rows, one m-vector per class factor) and the
        Gauss–Hermite integrals of eq. (19), whose nodes take 8 · 64 · C · (2C + 3) bytes a row
        (2.6 MB at C = 50: about 25 rows at a time).  A row's integrals do not depend on the
        rows computed with it (bit for bit); its latent moments agree with those of a larger
        block to rounding (BLAS products of another shape).  ``validation_data`` is scored the
        same way."""
        self._check_fitted()
        latent, C, rho = self._latent(), len(self.classes_), self._state.rho
        step = proba_block_rows(C)

        def block(Xb, _):
            means, varis = latent(Xb, Tasks())
            out = np.empty_like(means)
            for a in range(0, len(means), step):
                out[a:a + step] = argmax_probabilities(means[a:a + step], varis[a:a + step])
            return out

        parts = self._row_blocks(X, block, latent_block_rows(self._state))
        return rho / C + (1.0 - rho) * np.concatenate(parts)

    def outlier_probability(self, X, y):
        """Q(zᵢ = 1) of any labelled rows by their local EP (derivation §7): the rows' pair factors
        fitted against the cavity of a training row under tied sites (q less one of n shares), or
        against q itself (rows taken as new observations: their own sites, if they are training
        rows, are not removed); the outlier prior is the fitted rate (Q's mean under the Beta
        treatment).  Zeros for model="standard".  For method="vi": the q-average of zᵢ's
        posterior at known fᵢ, E_q[p(zᵢ = 1 | yᵢ, fᵢ)] (:mod:`gpc.multiclass.sparse_vi`)."""
        self._check_fitted()
        y = self._check_y(y, np.shape(X)[0])
        index = self._class_index(y)
        rows = getattr(self._state, "outlier_rows", None)      # method="vi"
        if rows is None:
            rows = partial(row_outlier_probability, self._state)
        parts = self._row_blocks(X, lambda Xb, r: rows(Xb, index[r[0]:r[1]], Tasks()))
        return np.concatenate(parts)
