"""The scikit-learn-compatible estimator.

``GaussianProcessClassifier`` fits any binary method of :func:`gpc.infer` and extends it to several
classes one-vs-rest or one-vs-one, as scikit-learn's estimator of the same name does.  Its base,
:class:`gpc._estimator.GPCEstimator`, is scikit-learn's ``BaseEstimator`` and ``ClassifierMixin``
when scikit-learn is installed and a small local one otherwise.
"""

import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, cast

import numpy as np
from numpy.typing import ArrayLike

from . import _threads
from ._estimator import GPCEstimator, check_n_jobs, independent_generators, int_seed
from ._validation import check_finite_array, check_optimizer, check_positive_int, plain
from .inference import METHODS, infer
from .kernels import ConstantKernel, RBF, as_kernel, user_kernel
from .likelihoods import get_likelihood
from .optimize import bound_check_theta, maximise_evidence

try:  # pragma: no branch
    from sklearn.gaussian_process.kernels import CompoundKernel as _CompoundKernel
except ImportError:  # pragma: no cover - exercised only without scikit-learn
    _CompoundKernel = None


class _OnlyForOnline:
    """Descriptor: the method exists (``hasattr`` is True) only on estimators with method="online",
    so tools that probe for ``partial_fit`` (scikit-learn's checks, incremental pipelines) see it
    only where it works."""

    def __init__(self, fn):
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        if str(obj.method).lower() != "online":
            raise AttributeError(f"partial_fit is available with method='online' only, not {obj.method!r}")
        return self.fn.__get__(obj, owner)


#: P(y = classes_[1]) of a tie: the largest double below 1/2 (the tie goes to classes_[0])
_BELOW_HALF = float(np.nextafter(0.5, 0.0))

#: step in log θ of the central differences used for methods without an analytic evidence gradient
FD_STEP = 1e-4


def _default_kernel():
    # scikit-learn's default: 1.0 * RBF(1.0) with both hyperparameters fixed
    return ConstantKernel(1.0, constant_value_bounds="fixed") * RBF(1.0, length_scale_bounds="fixed")


class _BinaryGPC:
    """One binary problem: labels ±1, a kernel, a method; fits θ and holds the posterior.

    Its public face is that of scikit-learn's binary estimator (``kernel_``, ``X_train_``,
    ``log_marginal_likelihood``, ``latent_mean_and_variance``, ``predict_proba``), so code that walks
    ``base_estimator_.estimators_`` works unchanged.
    """

    def __init__(self, kernel, likelihood, method, schedule, optimizer, n_restarts, max_iter, tol,
                 rng, method_options, warm_start=False, verbose=0, label="fit"):
        self.kernel = kernel
        self.likelihood = likelihood
        self.method = method
        self.schedule = schedule
        self.optimizer = optimizer
        self.n_restarts = n_restarts
        self.max_iter = max_iter
        self.tol = tol
        self.rng = rng
        self.method_options = method_options
        self.warm_start = warm_start
        self.verbose = verbose
        self.label = label

    @property
    def kernel_(self):
        """The fitted kernel as the user gave it: a scikit-learn kernel stays a scikit-learn kernel."""
        return user_kernel(self._kernel)

    def _infer(self, kernel, init=None, check_kernel=True, K=None):
        if K is None:
            K = kernel(self.X_train_)
        options = dict(self.method_options)
        if init is not None:
            options["init"] = init
        return infer(K, self.y_train_, likelihood=self.likelihood, method=self.method,
                     schedule=self.schedule, max_iter=self.max_iter, tol=self.tol,
                     check_kernel=check_kernel, **options)

    def _evidence(self, kernel, eval_gradient=False, init=None, check_kernel=False):
        """(log evidence, [gradient,] result) of ``kernel`` (gpc interface) on the training data."""
        K = kernel(self.X_train_)     # the inference reads K and does not change it
        result = self._infer(kernel, init=init, check_kernel=check_kernel, K=K)
        if not eval_gradient:
            return result.log_evidence, result
        theta = kernel.theta
        if result.gradient_matrix is None:
            # the method's evidence has no analytic gradient (e.g. online ADF): central differences
            # of the evidence itself, step FD_STEP in log θ (documented in the estimator)
            grad = np.empty(len(theta))
            for k in range(len(theta)):
                step = np.zeros(len(theta))
                step[k] = FD_STEP
                up = self._infer(kernel.clone_with_theta(theta + step), check_kernel=False)
                down = self._infer(kernel.clone_with_theta(theta - step), check_kernel=False)
                grad[k] = (up.log_evidence - down.log_evidence) / (2 * FD_STEP)
            result.info["gradient"] = "finite-differences"
            return result.log_evidence, grad, result
        # the kernel's values come from K (a stationary kernel recomputes no exponentials), and M is
        # symmetric (InferenceResult.gradient_matrix) so only its lower triangle is read; where that
        # is all the kernel reads, M's upper triangle is not even written
        grad = result.log_evidence_gradient(
            lambda M: kernel.gradient_contract(self.X_train_, M, K=K, symmetric=True),
            lower=kernel._reads_lower_triangle())
        return result.log_evidence, grad, result

    def log_marginal_likelihood(self, theta=None, eval_gradient=False, clone_kernel=True):
        """scikit-learn's binary ``log_marginal_likelihood``: NumPy float64 value (and gradient).

        K at ``theta`` is not checked for positive definiteness: ``fit`` checked the kernel, and
        the optimiser's evaluations skip the check the same way.  With ``warm_start`` the
        inference starts from the last posterior, as scikit-learn's Newton iteration does.
        """
        if theta is None:
            if eval_gradient:
                raise ValueError("Gradient can only be evaluated for theta!=None")
            return self.log_marginal_likelihood_value_
        if clone_kernel:
            kernel = self._kernel.clone_with_theta(theta)
        else:   # as scikit-learn: the fitted kernel itself takes theta
            kernel = self._kernel
            kernel.theta = theta
        out = self._evidence(kernel, eval_gradient, init=self._last if self.warm_start else None)
        self._last = out[-1]
        if eval_gradient:
            return np.float64(out[0]), np.asarray(out[1], dtype=np.float64)
        return np.float64(out[0])

    def partial_fit(self, X, y):
        """Absorb new points in one ADF pass (method "online"), the kernel as fitted."""
        if not hasattr(self, "result_"):
            self.X_train_, self.y_train_ = X, y
            self._kernel = as_kernel(self.kernel).clone_with_theta(as_kernel(self.kernel).theta)
            self.result_ = self._infer(self._kernel)
            self.log_marginal_likelihood_value_ = np.float64(self.result_.log_evidence)
            return self
        X_all = np.vstack([self.X_train_, X])
        y_all = np.concatenate([self.y_train_, y])
        K = self._kernel(X_all)
        options = dict(self.method_options)
        options.pop("order", None)          # streaming: the new points in the order they come
        options.pop("random_state", None)
        options["warm_start"] = self.result_.info
        self.result_ = infer(K, y_all, likelihood=self.likelihood, method=self.method,
                             max_iter=self.max_iter, tol=self.tol, **options)
        self.X_train_, self.y_train_ = X_all, y_all
        self.log_marginal_likelihood_value_ = np.float64(self.result_.log_evidence)
        return self

    def fit(self, X, y, init=None):
        """Fit θ (unless no optimizer) and the posterior; ``init`` is a previous posterior to start
        from (``warm_start``)."""
        self.X_train_ = X
        self.y_train_ = y
        self._kernel = as_kernel(self.kernel).clone_with_theta(as_kernel(self.kernel).theta)
        if self.optimizer is not None and self._kernel.n_dims > 0:
            # the kernel matrix is checked for positive definiteness at the start and at the end;
            # the optimiser's evaluations in between skip the extra factorisation
            state = {"init": self._infer(self._kernel, init=init)}

            def objective(theta):
                value, grad, result = self._evidence(self._kernel.clone_with_theta(theta), True,
                                                     init=state["init"])
                state["init"] = result
                return value, grad

            theta, value, grad = maximise_evidence(
                objective, self._kernel.theta, self._kernel.bounds, optimizer=self.optimizer,
                n_restarts=self.n_restarts, random_state=self.rng, return_gradient=True,
                verbose=self.verbose, label=self.label)
            self._kernel = self._kernel.clone_with_theta(theta)
            # scikit-learn's ConvergenceWarning at a bound, for the θ the optimiser cannot tell
            # from a bound (bound_check_theta); the fitted θ stays as found
            self._kernel.clone_with_theta(bound_check_theta(theta, self._kernel.bounds, value,
                                                            grad))._check_bounds_params()
            # the final posterior continues from the optimiser's last one, as every evaluation did
            # (GPML's infEP keeps its sites across calls the same way): a cold restart can land
            # elsewhere, e.g. undamped parallel EP diverges from zero sites with logit at large σ²
            # where the warm-started evaluations converged (breast cancer, PL Table I)
            self.result_ = self._infer(self._kernel, init=state["init"])
        else:
            self.result_ = self._infer(self._kernel, init=init)
        self._last = self.result_
        self.log_marginal_likelihood_value_ = np.float64(self.result_.log_evidence)
        return self

    def latent_mean_and_variance(self, X):
        """Latent predictive mean and variance at X, each of shape (n,)."""
        K_cross = self._kernel(self.X_train_, X)
        return self.result_.predict(K_cross, self._kernel.diag(X))

    def proba_positive(self, X):
        mean, var = self.latent_mean_and_variance(X)
        # a predictive variance of exactly 0 (clamped from rounding, e.g. a Linear kernel through
        # the training points) means p(+1 | mean) itself; the smallest normal float gives that
        return self.result_.likelihood.predictive_probability(mean, np.maximum(var, np.finfo(float).tiny))

    def predict_proba(self, X):
        p = self.proba_positive(X)
        return np.column_stack([1.0 - p, p])


class _MultiClass:
    """``base_estimator_`` for more than two classes: the binary problems as ``estimators_``, the
    attribute scikit-learn's OneVsRestClassifier / OneVsOneClassifier give."""

    def __init__(self, estimators, multi_class, n_jobs):
        self.estimators_ = estimators
        self.multi_class = multi_class
        self.n_jobs = n_jobs


class GaussianProcessClassifier(GPCEstimator):
    """Gaussian process classification with any of gpc's approximate inference methods.

    A drop-in for ``sklearn.gaussian_process.GaussianProcessClassifier``: the same ``fit``,
    ``predict``, ``predict_proba``, ``score``, ``log_marginal_likelihood`` and attributes, with the
    likelihood and the approximation as parameters.

    Parameters
    ----------
    kernel : gpc or scikit-learn kernel, default 1.0 * RBF(1.0) with fixed hyperparameters
    likelihood : str or Likelihood, default "probit"
        "probit", "logit", "noisy_threshold" or "heaviside" (or an instance, e.g. NoisyThreshold(0.05)).
    method : str or None, default None (meaning "ep")
        Any name of :func:`gpc.inference.available_methods`.
    schedule : str or None
        "sequential" or "parallel" for EP and PL; None is the method's default.
    optimizer : "fmin_l_bfgs_b", callable or None, default "fmin_l_bfgs_b"
        Type-II maximum likelihood over the kernel's log-hyperparameters (see :mod:`gpc.optimize`);
        None keeps the kernel's hyperparameters.  Methods whose evidence has no analytic gradient
        (``"online"``) are optimised with central differences of their evidence (step ``FD_STEP`` in
        log θ, 2p extra evaluations per gradient); the result's ``info["gradient"]`` says so.
    n_restarts_optimizer : int, default 0
    max_iter, tol : int and float or None
        The inference method's iteration limit and tolerance (None: the method's defaults).
    multi_class : "one_vs_rest" or "one_vs_one", default "one_vs_rest"
    random_state : int, Generator, RandomState or None
    method_options : dict or None
        Further options for the method (e.g. ``{"damping": 0.5}`` for EP).  The parallel EP and PL
        schedules halve ``damping`` when their updates oscillate or fail, down to ``min_damping``
        (default 2⁻¹⁰; ``None`` keeps it fixed), recorded in the result's ``info``.  ``fit`` with
        ``method="online"`` presents the data in a seeded random order (``{"order": "random"}``, seed
        from ``random_state``, 0 if None) unless ``order`` is given: in file order, often sorted by
        class, ADF's evidence favours a degenerate, near-constant fit.
    max_iter_predict : int, default 100
        scikit-learn's limit on the Newton iterations of the Laplace approximation; used as
        ``max_iter`` when the method is "laplace" and ``max_iter`` is None.
    warm_start : bool, default False
        Start each inference from the last posterior of the same binary problem: a refit on data of
        the same size starts from the previous fit's posterior, and ``log_marginal_likelihood``
        calls continue from the last one (scikit-learn's meaning for its Newton iteration).  The
        optimiser's evaluations within one fit are always warm started.
    copy_X_train : bool, default True
        Keep a copy of the training inputs; False keeps a reference (which later changes of the
        caller's array then affect).
    n_jobs : int or None, default None
        Threads fitting the binary problems of one-vs-rest / one-vs-one, with joblib's convention:
        None as many as BLAS may use (threadpoolctl's limit, else OMP_NUM_THREADS /
        OPENBLAS_NUM_THREADS, else every core), -1 every core, -2 all but one, k > 0 exactly k.
        The fit does not depend on it.
    verbose : int, default 0
        Progress on stderr (not a scikit-learn parameter): 1 prints one line per optimiser start
        of each binary problem (its best log evidence and how many evaluations it took), 2 also
        one line per evaluation of the evidence.

    Attributes
    ----------
    classes_, n_classes_, n_features_in_, X_train_
    feature_names_in_ : ndarray of str, set when X has string column names (a DataFrame), as in
        scikit-learn; prediction checks them
    kernel_ : the fitted kernel, of the kind passed in (a scikit-learn kernel stays one); for more
        than two classes scikit-learn's ``CompoundKernel`` of the binary problems' kernels (a list
        without scikit-learn)
    base_estimator_ : the binary problem's estimator, or for more than two classes an object whose
        ``estimators_`` are the binary problems (as scikit-learn's OneVsRest/OneVsOne classifiers)
    log_marginal_likelihood_value_ : numpy.float64, the mean over the binary problems
    n_iter_, converged_, base_estimators_ (the list of binary problems)

    Examples
    --------
    >>> from gpc import GaussianProcessClassifier
    >>> from gpc.datasets import load_banana
    >>> from gpc.kernels import ConstantKernel, RBF
    >>> X, y = load_banana(return_X_y=True)
    >>> X, y = X[:300], y[:300]
    >>> clf = GaussianProcessClassifier(ConstantKernel(1.0) * RBF(1.0), method="ep").fit(X, y)
    >>> clf.predict_proba(X[:2]).shape
    (2, 2)
    >>> bool(clf.score(X, y) > 0.85)
    True
    """

    def __init__(self, kernel=None, likelihood="probit", method=None, schedule=None,
                 optimizer="fmin_l_bfgs_b", n_restarts_optimizer=0, max_iter=None, tol=None,
                 multi_class="one_vs_rest", random_state=None, method_options=None,
                 max_iter_predict=100, warm_start=False, copy_X_train=True, n_jobs=None,
                 verbose=0):
        self.kernel = kernel
        self.likelihood = likelihood
        self.method = method
        self.schedule = schedule
        self.optimizer = optimizer
        self.n_restarts_optimizer = n_restarts_optimizer
        self.max_iter = max_iter
        self.tol = tol
        self.multi_class = multi_class
        self.random_state = random_state
        self.method_options = method_options
        self.max_iter_predict = max_iter_predict
        self.warm_start = warm_start
        self.copy_X_train = copy_X_train
        self.n_jobs = n_jobs
        self.verbose = verbose

    # -- validation ---------------------------------------------------------------------------
    _fitted_attribute = "base_estimators_"

    def _vector_input(self):
        """Whether X holds float vectors: not for kernels of strings, graphs, ... (scikit-learn's
        ``requires_vector_input = False``), which read X as given."""
        return self.kernel is None or getattr(self.kernel, "requires_vector_input", True)

    def _check_kernel(self):
        """Before X is looked at, as scikit-learn's estimator does: one kernel, not a CompoundKernel
        (each binary problem fits its own; ``kernel_`` is a CompoundKernel after fitting more)."""
        if _CompoundKernel is not None and isinstance(self.kernel, _CompoundKernel):
            raise ValueError("kernel cannot be a CompoundKernel")

    def _resolve(self):
        method = self.method
        if method is None:
            method = "ep"
        if str(method).lower() not in METHODS:
            raise ValueError(f"unknown method {method!r}; available: {', '.join(sorted(METHODS))}")
        if self.multi_class not in ("one_vs_rest", "one_vs_one"):
            raise ValueError(f"multi_class must be 'one_vs_rest' or 'one_vs_one', got {self.multi_class!r}")
        check_positive_int(self.n_restarts_optimizer, "n_restarts_optimizer", minimum=0)
        check_optimizer(self.optimizer)
        check_positive_int(self.max_iter_predict, "max_iter_predict")
        for name in ("warm_start", "copy_X_train"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        check_n_jobs(self.n_jobs)
        return str(method).lower(), get_likelihood(self.likelihood)

    def _max_iter(self, method):
        # scikit-learn's max_iter_predict bounds Laplace's Newton iterations; gpc's max_iter wins
        if self.max_iter is None and method == "laplace":
            return int(self.max_iter_predict)
        return self.max_iter

    def _n_threads(self, n_problems):
        return min(self._n_jobs(), n_problems)

    # -- fitting ------------------------------------------------------------------------------
    def fit(self, X: ArrayLike, y: ArrayLike) -> "GaussianProcessClassifier":
        """Fit the hyperparameters (unless ``optimizer=None``) and the posterior of each binary problem."""
        self._check_kernel()
        X = cast(np.ndarray, self._check_X(X, fitting=True))
        n = len(X)
        y = self._check_y(y, n)
        method, likelihood = self._resolve()
        self.classes_, y_index = np.unique(y, return_inverse=True)
        self.n_classes_ = len(self.classes_)
        if X.ndim == 2:
            self.n_features_in_ = X.shape[1]
        if self.n_classes_ < 2:
            raise ValueError("GaussianProcessClassifier requires 2 or more distinct classes; got 1 class "
                             f"(only class {self.classes_[0]} is present)")
        kernel = _default_kernel() if self.kernel is None else self.kernel
        options = dict(self.method_options or {})
        if method in ("ep", "pl") and "random_state" not in options and self.random_state is not None:
            options["random_state"] = self.random_state
        if method == "online" and "order" not in options:
            # ADF in file order (often sorted by class) rewards a near-constant latent function and
            # drives type-II ML to a degenerate optimum (gpc.inference.online): a seeded random order,
            # the same in every evaluation of the evidence
            options["order"] = "random"
            options.setdefault("random_state", int_seed(self.random_state))
        X_train = np.copy(X) if self.copy_X_train else X

        #: (positive class, negative class or None for "the rest"); (rows or None for all, ±1 labels)
        self._pairs: list[tuple[int, Optional[int]]]
        problems: list[tuple[Optional[np.ndarray], np.ndarray]]
        if self.n_classes_ == 2:
            self._pairs = [(1, 0)]
            problems = [(None, np.where(y_index == 1, 1.0, -1.0))]
        elif self.multi_class == "one_vs_rest":
            self._pairs = [(c, None) for c in range(self.n_classes_)]
            problems = [(None, np.where(y_index == c, 1.0, -1.0)) for c in range(self.n_classes_)]
        else:
            self._pairs = list(itertools.combinations(range(self.n_classes_), 2))
            problems = []
            for i, j in self._pairs:
                rows = np.flatnonzero((y_index == i) | (y_index == j))
                problems.append((rows, np.where(y_index[rows] == i, 1.0, -1.0)))
        # warm_start: each problem starts from its previous posterior when the data keep their size
        previous = getattr(self, "base_estimators_", None) if self.warm_start else None
        if previous is None or len(previous) != len(problems):
            inits = [None] * len(problems)
        else:
            inits = [b.result_ if hasattr(b, "result_") and len(b.y_train_) == len(labels) else None
                     for b, (_, labels) in zip(previous, problems)]
        rngs = independent_generators(self.random_state, len(problems))
        labels = [f"{type(self).__name__} {self._problem_name(pair)}" for pair in self._pairs]
        binaries = [_BinaryGPC(kernel, likelihood, method, self.schedule, self.optimizer,
                               self.n_restarts_optimizer, self._max_iter(method), self.tol, rng, options,
                               warm_start=bool(self.warm_start), verbose=int(self.verbose),
                               label=label) for rng, label in zip(rngs, labels)]

        def fit_one(k):
            rows, labels = problems[k]
            return binaries[k].fit(X_train if rows is None else X_train[rows], labels, init=inits[k])

        threads = self._n_threads(len(problems))
        if threads > 1:     # the problems in threads, each on one BLAS thread (gpc._threads)
            with ThreadPoolExecutor(max_workers=threads) as pool:
                fits = list(pool.map(_threads.inherit(fit_one), range(len(problems))))
        else:
            with _threads.blas("dense", n):
                fits = [fit_one(k) for k in range(len(problems))]
        self._set_fitted(fits, X_train)
        self.n_iter_ = fits[0].result_.n_iter if len(fits) == 1 else np.array([b.result_.n_iter for b in fits])
        self.converged_ = bool(all(b.result_.converged for b in fits))
        return self

    def _problem_name(self, pair):
        positive, negative = pair
        if self.n_classes_ == 2:
            return "(binary)"
        name = plain(self.classes_[positive])
        return f"{name!r} vs rest" if negative is None else f"{name!r} vs {plain(self.classes_[negative])!r}"

    def _set_fitted(self, fits, X_train):
        """The attributes common to fit and partial_fit, from the fitted binary problems."""
        self.base_estimators_ = fits
        self.X_train_ = X_train
        self.base_estimator_ = (fits[0] if len(fits) == 1
                                else _MultiClass(fits, self.multi_class, self.n_jobs))
        self.log_marginal_likelihood_value_ = np.float64(np.mean([b.result_.log_evidence for b in fits]))
        if len(fits) == 1:
            self.kernel_ = fits[0].kernel_
        elif _CompoundKernel is not None:
            self.kernel_ = _CompoundKernel([b.kernel_ for b in fits])
        else:  # pragma: no cover - without scikit-learn
            self.kernel_ = [b.kernel_ for b in fits]

    @_OnlyForOnline
    def partial_fit(self, X: ArrayLike, y: ArrayLike,
                    classes: Optional[ArrayLike] = None) -> "GaussianProcessClassifier":
        """Streaming fit with the online ADF algorithm (``method="online"``, MF paper §5).

        Each call absorbs the new points in one assumed-density-filtering pass, starting from the
        posterior of the points seen so far; the kernel's hyperparameters are kept as given (no
        optimiser: ADF sees each point once).  ``classes`` must list every class on the first call
        unless the first batch contains them all.  One-vs-rest for more than two classes.
        """
        self._check_kernel()
        X = cast(np.ndarray, self._check_X(X, fitting=not hasattr(self, "base_estimators_")))
        y = self._check_y(y, X.shape[0])
        method, likelihood = self._resolve()
        if not hasattr(self, "base_estimators_"):
            self.classes_ = np.unique(y) if classes is None else np.unique(np.asarray(classes))
            self.n_classes_ = len(self.classes_)
            self.n_features_in_ = X.shape[1]
            if self.n_classes_ < 2:
                raise ValueError("partial_fit needs at least two classes: pass classes=[...] on the first call")
            kernel = _default_kernel() if self.kernel is None else self.kernel
            n_problems = 1 if self.n_classes_ == 2 else self.n_classes_
            self._pairs = [(1, 0)] if n_problems == 1 else [(c, None) for c in range(self.n_classes_)]
            self.base_estimators_ = [
                _BinaryGPC(kernel, likelihood, method, None, None, 0, self.max_iter, self.tol,
                           rng, dict(self.method_options or {})) for rng in independent_generators(self.random_state, n_problems)]
        unknown = np.setdiff1d(np.unique(y), self.classes_)
        if unknown.size:
            raise ValueError(f"y has classes {unknown.tolist()} not in classes_ {self.classes_.tolist()}")
        index = np.searchsorted(self.classes_, y)
        for (c, _), b in zip(self._pairs, self.base_estimators_):
            b.partial_fit(X, np.where(index == c, 1.0, -1.0))
        fits = self.base_estimators_
        self._set_fitted(fits, fits[0].X_train_)
        self.n_iter_ = fits[0].result_.n_iter
        self.converged_ = True
        return self

    # -- prediction -----------------------------------------------------------------------------
    def predict_latent(self, X: ArrayLike) -> Any:
        """Latent predictive mean and variance; arrays (n,) for two classes, (n, n_problems) otherwise."""
        self._check_fitted()
        X = self._check_X(X, fitting=False)
        out = [b.latent_mean_and_variance(X) for b in self.base_estimators_]
        if len(out) == 1:
            return out[0]
        return np.column_stack([m for m, _ in out]), np.column_stack([v for _, v in out])

    def latent_mean_and_variance(self, X: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """scikit-learn's name for the latent predictive mean and variance (two classes only).

        Returns
        -------
        latent_mean, latent_var : arrays of shape (n_samples,)
            Mean and variance of q(f*) = ∫ p(f* | f) q(f) df (R&W Alg. 3.2 lines 4 and 6 for Laplace;
            the site posterior's predictive for EP and the other methods).
        """
        self._check_fitted()
        if self.n_classes_ > 2:
            raise ValueError("Returning the mean and variance of the latent function f is only supported "
                             f"for binary classification, received {self.n_classes_} classes.")
        return self.predict_latent(X)

    def predict_proba(self, X: ArrayLike) -> np.ndarray:
        """Class probabilities, columns in the order of ``classes_``.

        Binary: P(y = classes_[1]) = ∫ p(+1|f) N(f | μ*, σ*²) df (closed form for probit, quadrature for
        logit).  One-vs-rest: the binary probabilities normalised to sum to one (as scikit-learn).
        One-vs-one: p_c ∝ Σ_{pairs containing c} P(c wins the pair), normalised.

        A tie, P(y = classes_[1]) of exactly 1/2 (a latent mean of exactly 0 with a symmetric
        likelihood), goes to ``classes_[0]``: its probability is the largest double below 1/2, so
        ``predict``, the argmax of these columns and the threshold ``[:, 1] >= 0.5`` agree, as
        they do in scikit-learn's estimator (which predicts ``classes_[1]`` for a latent mean
        above 0 only, and whose probability at 0 is a little below 1/2).
        """
        self._check_fitted()
        X = cast(np.ndarray, self._check_X(X, fitting=False))
        if self.n_classes_ == 2:
            p = self.base_estimators_[0].proba_positive(X)
            p = np.where(p == 0.5, _BELOW_HALF, p)
            return np.column_stack([1.0 - p, p])
        P = np.zeros((len(X), self.n_classes_))
        for (i, j), b in zip(self._pairs, self.base_estimators_):
            p = b.proba_positive(X)
            if j is None:
                P[:, i] = p
            else:
                P[:, i] += p
                P[:, j] += 1.0 - p
        total = P.sum(axis=1, keepdims=True)
        # every one-vs-rest probability of a row can underflow to 0 (far from all data at a huge
        # σ²): no class is preferred, so the row is uniform rather than all zeros
        return np.where(total > 0, P / np.where(total > 0, total, 1.0), 1.0 / self.n_classes_)

    def predict(self, X: ArrayLike) -> np.ndarray:
        """The class with the largest predictive probability."""
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]

    def log_marginal_likelihood(self, theta: Optional[ArrayLike] = None, eval_gradient: bool = False,
                                clone_kernel: bool = True) -> Any:
        """The method's log evidence at ``theta`` (log hyperparameters), as in scikit-learn.

        Returns NumPy float64 values, as scikit-learn does.  With several binary problems, ``theta``
        is either one kernel's θ (used for all of them) or the problems' θ concatenated (the
        ``CompoundKernel``'s θ), and the mean of their evidences is returned; unlike scikit-learn,
        the mean gradient is returned too.  ``clone_kernel=False`` sets θ on the fitted kernels
        themselves instead of copies.  Nothing that ``fit`` checked is checked again: K at ``theta``
        goes to the inference without a positive-definiteness test.
        """
        self._check_fitted()
        if theta is None:
            if eval_gradient:
                raise ValueError("Gradient can only be evaluated for theta!=None")
            return self.log_marginal_likelihood_value_
        theta = check_finite_array(theta, "theta", ndim=1)
        fits = self.base_estimators_
        p = fits[0]._kernel.n_dims
        if theta.shape[0] == p:
            thetas = [theta] * len(fits)
        elif theta.shape[0] == p * len(fits):
            thetas = [theta[p * k:p * (k + 1)] for k in range(len(fits))]
        else:
            raise ValueError(f"Shape of theta must be either {p} or {p * len(fits)}. Obtained theta with "
                             f"shape {theta.shape[0]}.")
        out = [b.log_marginal_likelihood(t, eval_gradient, clone_kernel=clone_kernel)
               for b, t in zip(fits, thetas)]
        if not clone_kernel:
            self._set_fitted(fits, self.X_train_)   # kernel_ shows the θ just set, as scikit-learn's
        if eval_gradient:
            return np.mean([v for v, _ in out]), np.mean([g for _, g in out], axis=0)
        return np.mean(out)

