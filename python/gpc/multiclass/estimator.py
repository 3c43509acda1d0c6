"""``MultiClassGPC``: RMGPC, SMGPC and HTPC (RMGPC paper) as a scikit-learn-style estimator; the
models are entries of :data:`gpc.multiclass.models.MODELS`."""

from typing import cast

import numpy as np
from numpy.typing import ArrayLike

from .._estimator import GPCEstimator, check_n_jobs, median_length_scale, random_generator
from .._validation import check_optimizer, check_positive_float, check_positive_int, plain
from ..kernels import RBF, as_kernel
from ..optimize import maximise_evidence
from .models import MODELS

#: the fixed label noise ε's default bounds when it is learnt (model="robust", label_noise=ε)
LABEL_NOISE_BOUNDS = (1e-6, 0.4)
#: a kernel hyperparameter is a pure amplitude if K(θ + e_j) equals e · K(θ) to this relative
#: tolerance (log-space θ: an amplitude scales K by e^Δ), checked on at most AMPLITUDE_ROWS rows
AMPLITUDE_RTOL, AMPLITUDE_ROWS = 1e-10, 50


def check_label_noise(label_noise, bounds, model):
    """``label_noise`` ("beta" or a float ε in (0, 1), the latter for model "robust" only) and
    ``label_noise_bounds`` ("fixed" or 0 < low <= high < 1), checked with messages naming them (the
    rules of every multi-class estimator)."""
    if isinstance(label_noise, str):
        if label_noise != "beta":
            raise ValueError(f"label_noise must be 'beta' or a float ε in (0, 1), got "
                             f"{label_noise!r}")
    else:
        eps = check_positive_float(label_noise, "label_noise")
        if model != "robust":
            raise ValueError("label_noise=ε (fixed label noise) is a noise treatment of "
                             f"model='robust', not of model={model!r}")
        if eps >= 1.0:
            raise ValueError(f"label_noise must lie in (0, 1), got {eps!r}")
    if not (isinstance(bounds, str) and bounds == "fixed"):
        try:
            lo, hi = (float(b) for b in bounds)
        except (TypeError, ValueError):
            raise ValueError(f"label_noise_bounds must be 'fixed' or (low, high), got "
                             f"{bounds!r}") from None
        if not 0.0 < lo <= hi < 1.0:
            raise ValueError(f"label_noise_bounds must satisfy 0 < low <= high < 1, got "
                             f"{bounds!r}")


def check_label_noise_classes(label_noise, bounds, learns, n_classes):
    """A fixed ε (and, when it is learnt, its bounds' upper end) below (l − 1)/l for l classes,
    where the labels carry no information (ρ = 1)."""
    top = (n_classes - 1) / n_classes
    if not label_noise < top:
        raise ValueError(f"label_noise must be below (l - 1)/l = {top:.6g} for {n_classes} "
                         f"classes, got {label_noise!r}")
    if learns and not float(bounds[1]) < top:
        raise ValueError(f"label_noise_bounds' upper end must be below (l - 1)/l = {top:.6g} "
                         f"for {n_classes} classes, got {bounds!r}")


class MultiClassGPC(GPCEstimator):
    """Multi-class GP classifier with l latent functions and the argmax likelihood (RMGPC paper).

    model="robust" is RMGPC: P(yᵢ | f, zᵢ) = Π_{k≠yᵢ} Θ(f_yᵢ(xᵢ) − f_k(xᵢ)) when zᵢ = 0 and 1/l when the
    outlier indicator zᵢ = 1 (eq. (2)), zᵢ ~ Bern(ρ), ρ ~ Beta(a0, b0) (eq. (3)-(4)), fitted by EP
    (§3).  model="standard" is SMGPC: b₀ → ∞ (no outliers) and a learned noise ϑ_k² added to the
    diagonal of each K_k (§4).  Hyperparameters (log space) maximise the EP evidence (16) with its
    gradient (18) by L-BFGS-B.  model="heavy-tailed" is HTPC (§4, after Wauthier & Jordan): GP
    priors transformed to hyperbolic secant marginals with scales b_k, a multinomial logit
    likelihood and the Laplace approximation, γ and b_k maximising its evidence (finite-difference
    gradient); see :mod:`gpc.multiclass.htpc` and docs/derivations-rmgpc.md.

    model="robust" with ``label_noise=ε`` keeps RMGPC's likelihood but with a fixed outlier rate
    instead of its Beta posterior: p(yᵢ | fᵢ) = (1 − ε) pᵢ + ε/(l − 1) (1 − pᵢ), pᵢ = 1 when yᵢ is the
    argmax (the likelihood of the scalable multi-class EP paper, Villacampa-Calvo and
    Hernández-Lobato), i.e. zᵢ ~ Bern(ρ) with ρ = ε l/(l − 1) fixed; ε is a hyperparameter, learnt
    with the kernel's by its evidence gradient unless ``label_noise_bounds="fixed"``
    (docs/derivations-rmgpc.md, "Fixed label noise").

    Which hyperparameters each model can learn: the argmax likelihood is invariant under scaling
    every latent function by the same factor, and so are RMGPC's and SMGPC's EP evidence; HTPC
    standardises u_k(x)/√κ(x, x) before its copula.  A kernel amplitude (a hyperparameter that
    only scales K, such as ConstantKernel's constant in ``ConstantKernel(c) * RBF(ℓ)``) therefore
    leaves the evidence of "robust" and "heavy-tailed" unchanged, and that of "standard" unchanged
    together with the noises ϑ_k² scaled alike.  The estimator finds such amplitudes (K(θ + e_j) =
    e K(θ) in log space) and keeps them at their starting values, out of the optimiser's θ: all of
    them with a shared kernel, and with one kernel per class those of the first class and any beyond
    the first of each further class (the relative scales of the classes do matter).  So "robust"
    learns the kernel's other hyperparameters (and ε with ``label_noise=ε``); "standard" those and
    the ϑ_k² (relative to the kernel's fixed scale); "heavy-tailed" those and the scales b_k.

    With two classes and model="standard", f₁ − f₂ plays the role of binary GPC's latent function:
    the likelihood Θ(f₁ − f₂ + ε₁ − ε₂) is a probit in f₁ − f₂ with noise 2ϑ², and f₁ − f₂ has prior
    covariance 2K; EP's Q here keeps f₁ and f₂ independent, so it matches binary EP (probit, kernel
    2K, latent noise scale) closely but not exactly.

    Parameters
    ----------
    kernel : gpc or scikit-learn kernel, default RBF(median distance)
        The covariance c of eq. (22), exp(−‖x − x'‖²/(2γ)) with γ = length_scale².  The default
        RBF starts at the median distance between training rows (the median heuristic, on at most
        1000 rows), so that unscaled features start from a kernel on their scale; standardised
        features remain the better input (one length scale serves all of them).
    model : {"robust", "standard", "heavy-tailed"}
        RMGPC, SMGPC or HTPC (HTPC needs ``shared_kernel=True``, as in the paper).
    a0, b0 : float
        Beta prior of the outlier rate (paper's suggestion 1 and 9).
    shared_kernel : bool
        One kernel for all classes (eq. (22)) or one per class.
    optimizer : "fmin_l_bfgs_b", callable or None
    n_restarts_optimizer : int
    max_iter, tol : EP's limit on outer iterations and its tolerance on the undamped moment
        mismatch (:func:`gpc.multiclass.ep.rmgpc_ep`).  A ConvergenceWarning says when EP stops
        at max_iter at the fitted hyperparameters; the optimiser's other evaluations do not warn.
    random_state : seed for the restarts (and the rows of the median heuristic).
    n_jobs : int or None
        Threads over EP's l class blocks, or HTPC's BLAS threads, with joblib's convention: None
        as many as BLAS may use, -1 every core, -2 all but one, k > 0 exactly k.  BLAS runs on one
        thread during EP, and during HTPC's fit and prediction on n_jobs threads from n l = 1536
        (``gpc._threads.HTPC_BLAS_FROM``) and on one below, so more threads are never a second
        pool competing for the cores, nor BLAS threads sharing calls too small for them (the one
        thread policy, ``gpc._threads``).  The fit does not depend on it (HTPC: beyond rounding).
    label_noise : "beta" or float
        model="robust" only.  "beta": RMGPC's outlier rate ρ with a Beta(a0, b0) prior and
        posterior.  A float ε in (0, (l − 1)/l): fixed label noise (see above), its starting value.
    label_noise_bounds : (float, float) or "fixed", default (1e-6, 0.4)
        Bounds of ε when it is learnt (each below (l − 1)/l), or "fixed" to keep it.
    verbose : int, default 0
        Progress on stderr: 1 prints one line per optimiser start (its best log evidence and how
        many evaluations it took), 2 also one line per evaluation of the evidence.

    Attributes
    ----------
    feature_names_in_ : ndarray of str, set when X has string column names (a DataFrame), as in
        scikit-learn; prediction checks them
    classes_, n_classes_, n_features_in_, kernels_ (one per class), noise_ (SMGPC's ϑ_k²),
    n_iter_ (EP's outer iterations, i.e. class-block refactorisations, or HTPC's Newton steps, of
    the final fit), log_marginal_likelihood_value_, outlier_probability_ (eq. (21), one per
    training row in fit order; zeros for "standard" and "heavy-tailed"), ep_result_ (the
    converged EP state, with its damping record; for HTPC the Laplace approximation), scales_ (HTPC's b_k; None otherwise),
    label_noise_ (the fitted ε with ``label_noise=ε``; None otherwise), fixed_amplitudes_ (the
    indices of θ held at their starting values as pure amplitudes, see above).

    Memory: model="heavy-tailed" holds 2 (n l)² doubles at the peak of its fit and keeps
    (l + 2) n² with the fitted model (:mod:`gpc.multiclass.htpc`); "robust" and "standard" keep
    one n × n factor per class.

    Examples
    --------
    Ten labels of new-thyroid changed to another class are the ten most probable outliers:

    >>> import numpy as np
    >>> from gpc import MultiClassGPC
    >>> from gpc.datasets import load_thyroid
    >>> from gpc.kernels import RBF
    >>> data = load_thyroid(binary=False)
    >>> X = (data.X - data.X.mean(axis=0)) / data.X.std(axis=0)
    >>> y = data.y.copy()
    >>> rng = np.random.default_rng(0)
    >>> flipped = rng.choice(len(y), size=10, replace=False)
    >>> for i in flipped:
    ...     y[i] = rng.choice(np.setdiff1d(np.unique(y), [y[i]]))
    >>> clf = MultiClassGPC(kernel=RBF(2.0), optimizer=None, max_iter=40, tol=1e-3)
    >>> clf = clf.fit(X, y)
    >>> top = np.argsort(clf.outlier_probability_)[::-1][:10]
    >>> sorted(top.tolist()) == sorted(flipped.tolist())
    True
    """

    def __init__(self, kernel=None, model="robust", a0=1.0, b0=9.0, shared_kernel=True,
                 optimizer="fmin_l_bfgs_b", n_restarts_optimizer=0, max_iter=500, tol=1e-4,
                 random_state=None, n_jobs=None, label_noise="beta",
                 label_noise_bounds=LABEL_NOISE_BOUNDS, verbose=0):
        self.kernel = kernel
        self.model = model
        self.a0 = a0
        self.b0 = b0
        self.shared_kernel = shared_kernel
        self.optimizer = optimizer
        self.n_restarts_optimizer = n_restarts_optimizer
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.label_noise = label_noise
        self.label_noise_bounds = label_noise_bounds
        self.verbose = verbose

    # -- validation -----------------------------------------------------------------------------
    _fitted_attribute = "ep_result_"

    def _check_params(self):
        if self.model not in tuple(MODELS):
            raise ValueError(f"model must be one of {tuple(MODELS)}, got {self.model!r}")
        if self._model.shared_kernel_only and not self.shared_kernel:
            raise ValueError(f"model={self.model!r} ({self._model.label}) uses one kernel shared by "
                             "the classes: set shared_kernel=True")
        check_positive_float(self.a0, "a0")
        check_positive_float(self.b0, "b0")
        check_positive_int(self.max_iter, "max_iter")
        check_positive_float(self.tol, "tol")
        check_positive_int(self.n_restarts_optimizer, "n_restarts_optimizer", minimum=0)
        check_optimizer(self.optimizer)
        random_generator(self.random_state)     # a ValueError naming random_state
        check_n_jobs(self.n_jobs)
        check_label_noise(self.label_noise, self.label_noise_bounds, self.model)

    @property
    def _model(self):
        """The model's entry in the registry (:data:`gpc.multiclass.models.MODELS`)."""
        return MODELS[self.model]

    def _fixed_noise(self):
        """Whether ε is a hyperparameter: label_noise=ε on the robust model."""
        return self.model == "robust" and not isinstance(self.label_noise, str)

    def _learns_noise(self):
        """Whether θ carries log ε."""
        return self._fixed_noise() and not (isinstance(self.label_noise_bounds, str))

    def _check_label_noise(self):
        """ε and its bounds below (l − 1)/l (:func:`check_label_noise_classes`)."""
        if self._fixed_noise():
            check_label_noise_classes(self.label_noise, self.label_noise_bounds,
                                      self._learns_noise(), self.n_classes_)

    # -- the evidence as a function of θ ------------------------------------------------------------
    def _unpack(self, theta):
        """θ → (one kernel per class, the model's parameter per class (SMGPC's ϑ_k², HTPC's b_k) or
        None, fixed outlier rate ρ or None)."""
        l, p = self.n_classes_, self._base_kernel.n_dims
        n_kernels = 1 if self.shared_kernel else l
        kernels = [self._base_kernel.clone_with_theta(theta[j * p:(j + 1) * p]) for j in range(n_kernels)]
        if self.shared_kernel:
            kernels = kernels * l
        rest = theta[n_kernels * p:]
        per_class = np.exp(rest) if self._model.per_class is not None else None
        eps = self._label_noise(theta)
        rate = None if eps is None else eps * l / (l - 1)   # (1 − ε) p + ε/(l − 1)(1 − p) = (1 − ρ) p + ρ/l
        return kernels, per_class, rate

    def _label_noise(self, theta):
        """The fixed label noise ε at θ (its last entry when learnt), or None."""
        if not self._fixed_noise():
            return None
        return float(np.exp(theta[-1])) if self._learns_noise() else float(self.label_noise)

    def _evidence(self, theta, X, y, eval_gradient=True, init=None):
        """The model's approximation at θ, and with ``eval_gradient`` its evidence's gradient."""
        return self._model.evidence(self, theta, X, y, eval_gradient, init)

    # -- fitting ----------------------------------------------------------------------------------
    def fit(self, X: ArrayLike, y: ArrayLike) -> "MultiClassGPC":
        """Fit θ by type-II ML (if an optimizer is given) and run EP at the optimum.

        An evaluation that fails (EP or Laplace finds no valid state and raises) is handed to the
        optimiser as a failed one (−inf) and never becomes the next evaluation's warm start.
        """
        self._check_params()
        X = cast(np.ndarray, self._check_X(X, fitting=True))
        y = self._check_y(y, X.shape[0])
        self.classes_, y_index = np.unique(y, return_inverse=True)
        self.n_classes_ = len(self.classes_)
        self.n_features_in_ = X.shape[1]
        if self.n_classes_ < 2:
            raise ValueError(f"only one class ({plain(self.classes_[0])!r}) is present in y; classification "
                             "needs at least two")
        self._check_label_noise()
        if self.kernel is None:     # the median heuristic: a length scale on the features' scale
            kernel = RBF(median_length_scale(X, self._rng()))
        else:
            kernel = self.kernel
        self._base_kernel = as_kernel(kernel)
        n_kernels = 1 if self.shared_kernel else self.n_classes_
        theta0 = np.tile(self._base_kernel.theta, n_kernels)
        bounds = np.tile(self._base_kernel.bounds, (n_kernels, 1)).reshape(-1, 2)
        per_class = self._model.per_class
        if per_class is not None:     # SMGPC's ϑ_k² or HTPC's b_k
            theta0 = np.concatenate([theta0, np.full(self.n_classes_, np.log(per_class.init))])
            bounds = np.vstack([bounds, np.tile(np.log(per_class.bounds), (self.n_classes_, 1))])
        if self._learns_noise():      # log ε
            theta0 = np.append(theta0, np.log(self.label_noise))
            bounds = np.vstack([bounds, np.log(np.asarray(self.label_noise_bounds, dtype=float))])
        self.fixed_amplitudes_ = self._amplitude_dims(X, n_kernels)
        free = np.ones(theta0.size, dtype=bool)
        free[self.fixed_amplitudes_] = False
        theta = theta0
        last: dict = {}
        if self.optimizer is not None and np.any(free):
            def full(t):
                out = theta0.copy()
                out[free] = t
                return out

            def objective(t):
                try:   # warm start from the previous valid evaluation's state
                    res, grad = self._evidence(full(t), X, y_index, init=last.get("res"))
                except (np.linalg.LinAlgError, ArithmeticError, ValueError):
                    return -np.inf, np.zeros_like(t)     # failed: never a warm start
                if not (np.isfinite(res.log_evidence) and np.all(np.isfinite(grad))):
                    return -np.inf, np.zeros_like(t)
                last["res"] = res
                if res.log_evidence > last.get("best", (-np.inf,))[0]:
                    last["best"] = (res.log_evidence, full(t), res)
                return res.log_evidence, grad[free]
            start = theta0[free]
            t, _ = maximise_evidence(objective, start, bounds[free], optimizer=self.optimizer,
                                     n_restarts=self.n_restarts_optimizer,
                                     random_state=self._rng(), verbose=int(self.verbose),
                                     label=f"MultiClassGPC({self.model!r})")
            theta = full(t)
        self.theta_ = theta
        self.kernels_, values, _ = self._unpack(theta)
        self.noise_ = self.scales_ = None
        if per_class is not None:
            setattr(self, per_class.attribute, values)
        self.label_noise_ = self._label_noise(theta)
        self.ep_result_ = self._final_state(theta, X, y_index, last)
        if self._model.warn_unconverged is not None and not self.ep_result_.converged:
            self._model.warn_unconverged(self, X)
        self.n_iter_ = self.ep_result_.n_iter
        self.log_marginal_likelihood_value_ = self.ep_result_.log_evidence
        self.outlier_probability_ = (self.ep_result_.outlier_probability.copy() if self._model.outliers
                                     else np.zeros(X.shape[0]))
        self.X_train_ = X
        return self

    def _amplitude_dims(self, X, n_kernels):
        """Indices of θ that only scale the evidence's invariant direction (class docstring): the
        kernel's pure amplitudes, all of the first kernel's and those beyond the first of every
        further kernel."""
        p = self._base_kernel.n_dims
        if p == 0:
            return np.zeros(0, dtype=int)
        rows = X[:AMPLITUDE_ROWS]
        theta = self._base_kernel.theta
        K = self._base_kernel(rows)
        amplitude = []
        for j in range(p):
            step = np.zeros(p)
            step[j] = 1.0
            with np.errstate(all="ignore"):
                K1 = self._base_kernel.clone_with_theta(theta + step)(rows)
            if np.allclose(K1, np.e * K, rtol=AMPLITUDE_RTOL, atol=0.0) and np.any(K != 0):
                amplitude.append(j)
        fixed = list(amplitude) + [k * p + j for k in range(1, n_kernels) for j in amplitude[1:]]
        return np.array(sorted(fixed), dtype=int)

    def _final_state(self, theta, X, y, last):
        """The approximation at the chosen θ: the optimiser's own evaluation there when it made one.

        Re-running EP warm-started from the *last* evaluation (another θ) can end elsewhere: in a
        100-split glass run (rmgpc-glass-outliers) such a re-run stopped the command with a
        non-positive cavity.  A cold start is the fallback before giving up.
        """
        best = last.get("best")
        if best is not None and np.array_equal(best[1], theta):
            return best[2]
        try:
            return self._evidence(theta, X, y, eval_gradient=False, init=last.get("res"))
        except (np.linalg.LinAlgError, ArithmeticError, ValueError):
            if last.get("res") is None:
                raise
            return self._evidence(theta, X, y, eval_gradient=False)

    # -- prediction -------------------------------------------------------------------------------
    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Class probabilities (m, l), columns in the order of ``classes_``; RMGPC eq. (19)-(20)."""
        self._check_fitted()
        X = cast(np.ndarray, self._check_X(X, fitting=False))
        return self._model.predictive(self, X)

    def predict(self, X: ArrayLike) -> np.ndarray:
        """The class with the largest predictive probability."""
        self._check_fitted()
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]
