"""``SparseEstimator``: what the sparse estimators share, around the hooks where they differ.

:class:`gpc.SparseGaussianProcessClassifier` (one or several ±1 problems, SEP paper) and
:class:`gpc.SparseMultiClassGPC` (C latent functions with RMGPC's argmax likelihood) are two models
on the same sparse training: inducing points, a state per model, a trainer that runs epochs of
steps on a rows interface (gpc.sparse.core.trainers).  This module holds the estimator around them once:
``fit`` and ``partial_fit``, the set-up of a fit, training with its interrupt and failure policy
(docs/reliability.md, "Fitted states and interrupts"), the history with its validation scores,
the progress bar, the ``"auto"`` training defaults, prediction over row blocks, clone and pickling.
"""

import time
import warnings
from typing import cast

import numpy as np
from numpy.typing import ArrayLike

from .. import _parallel, _threads
from .._estimator import GPCEstimator, check_n_jobs
from .._parallel import BLOCK_ROWS
from .._validation import check_positive_float, check_positive_int, plain
from ..exceptions import ConvergenceWarning
from ..kernels import user_kernel
from ._passes import as_block, block_ranges

__all__ = ["SparseEstimator", "check_kernel_start"]

#: batch_size="auto": minibatches of AUTO_BATCH_SIZE rows from AUTO_MINIBATCH_FROM training rows on
AUTO_BATCH_SIZE, AUTO_MINIBATCH_FROM = 2000, 10_000
#: max_iter="auto": AUTO_BATCH_EPOCHS in batch (or L-BFGS-B evaluations); on minibatches enough
#: epochs to see about AUTO_ROWS rows, at least AUTO_MIN_EPOCHS and at most AUTO_BATCH_EPOCHS
AUTO_BATCH_EPOCHS, AUTO_ROWS, AUTO_MIN_EPOCHS = 100, 400_000, 2
#: max_iter="auto" in batch EP: stop after the first pass that moves no site by more than
#: AUTO_SITE_TOL (the trainer's ``tol``); at fixed parameters at most AUTO_FIXED_EPOCHS passes
#: (Anderson-accelerated passes settle in tens to a few hundred on the UCI sets), else at most
#: AUTO_BATCH_EPOCHS steps
AUTO_SITE_TOL, AUTO_FIXED_EPOCHS = 1e-8, 1000


def check_kernel_start(kernel, optimize_inducing):
    """A ValueError for a gpc kernel whose θ starts outside its bounds (the first step would clip
    it onto them), or that has no gradient in its inputs when Z is to move.

    Parameters
    ----------
    kernel : gpc.kernels.Kernel
        The starting kernel (a scikit-learn kernel already wrapped by ``as_kernel``).
    optimize_inducing : bool
        Whether the fit moves the inducing points Z (which needs ∂k/∂Z).
    """
    theta, bounds = kernel.theta, kernel.bounds
    slack = 1e-9 * np.maximum(1.0, np.abs(bounds))
    outside = (theta < bounds[:, 0] - slack[:, 0]) | (theta > bounds[:, 1] + slack[:, 1])
    if np.any(outside):
        names = [n for n, o in zip(kernel.hyperparameter_names, outside) if o]
        raise ValueError(f"the kernel's {', '.join(names)} start outside their bounds "
                         f"({user_kernel(kernel)!r}); widen the bounds or rescale X")
    if optimize_inducing and not kernel._has_grad_inputs():
        raise ValueError(f"the kernel {user_kernel(kernel)!r} has no gradient in its inputs, so the "
                         "inducing points cannot move: pass optimize_inducing=False (or a gpc "
                         "kernel)")


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


class SparseEstimator(GPCEstimator):
    """The base of the sparse estimators: fitting, training and the bookkeeping around a model.

    The subclass's ``fit`` and ``partial_fit`` (its own docstrings and types) call :meth:`_fit`
    and :meth:`_partial_fit`.  A fit runs ``_check_params()``, then ``_start_fit`` (classes, validation data, Z and the
    kernels, the minibatch size, the model and its trainer), then ``_train`` for the epochs of
    ``max_iter``: the trainer's steps on the training rows, one ``history_`` entry per epoch
    (log Z, failed steps, seconds and, with ``validation_data``, the held-out error and NLL).
    ``partial_fit`` starts a fit of one epoch or trains one more on the same rows.  An interrupt
    keeps the model of the last completed step, an error keeps it if it is valid, and before the
    first completed step the estimator is left unfitted (:meth:`_train`).

    A subclass defines its parameters (``__init__``), ``_fitted_attribute`` (the attribute that
    holds its model), ``_FLAGS`` (its boolean parameters) and these hooks:

    ``_check_params()``
        Checks the parameters that are the subclass's own (calling :meth:`_check_training_params`
        for the shared ones) and returns what its ``_new_trainer`` needs of them (the likelihood).
    ``_initial_model(X, rng)``
        The starting inducing points Z, (m, d) or one start per class (C, m, d), and the list of
        starting gpc kernels, drawn from ``rng`` in a fixed order; each kernel is checked by
        :func:`check_kernel_start`.
    ``_new_trainer(X, y, setup, Z, kernels, rng)``
        Sets the model attribute (``_fitted_attribute``) and returns its trainer (a
        gpc.sparse.core.trainers.Trainer whose ``states`` are the model's states); ``setup`` is what
        ``_check_params`` returned, ``self._batch`` the minibatch size (None: batch).
    ``_training_rows(X, y)``
        The rows interface a training call runs on (gpc.sparse.core.trainers.TrainingRows): in
        process, or on ``client``'s shards; it hands each state's sites back on ``close``.
    ``_auto_minibatches()``
        Whether ``batch_size="auto"`` may train on minibatches (from AUTO_MINIBATCH_FROM rows on).
    ``_has_model()``
        Whether the states hold a valid model (here: every state completed a step, a finite
        log Z); a subclass with further conditions extends it.

    Prediction runs over blocks of rows with :meth:`_row_blocks`.
    """

    _lazy_rows = True          # NumPy, np.memmap and Dask are read block by block
    #: the boolean parameters, checked by :meth:`_check_training_params`
    _FLAGS: tuple = ()
    #: what ``_start_fit`` and training set besides the model: removed by :meth:`_unfit`
    _FIT_STATE = ("classes_", "n_features_in_", "_trainer", "history_", "_sites_home", "_start",
                  "_batch", "_threads", "_step_work")

    # -- checks ------------------------------------------------------------------------------------
    def _check_training_params(self):
        """The checks every sparse estimator shares: m, the epochs, the minibatch size, the step,
        the jitter, the damping, n_jobs and the boolean flags (``_FLAGS``)."""
        for name in self._FLAGS:
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        check_positive_int(self.n_inducing, "n_inducing")
        if not (isinstance(self.max_iter, str) and self.max_iter == "auto"):
            check_positive_int(self.max_iter, "max_iter")
        if not (self.batch_size is None or (isinstance(self.batch_size, str)
                                            and self.batch_size == "auto")):
            check_positive_int(self.batch_size, "batch_size")
        check_positive_float(self.learning_rate, "learning_rate")
        check_positive_float(self.jitter, "jitter", allow_zero=True)
        if self.damping is not None:
            d = check_positive_float(self.damping, "damping")
            if d > 1:
                raise ValueError(f"damping must be in (0, 1], got {self.damping!r}")
        check_n_jobs(self.n_jobs)

    def _partial_fit_classes(self, y, classes, first):
        """``classes`` of a partial_fit call checked against the first call's, and on the first
        call the classes of the fit (``classes`` or those of y; at least two)."""
        if classes is not None:
            classes = np.unique(np.asarray(classes))
            if not first and not np.array_equal(classes, self.classes_):
                raise ValueError(f"classes={classes.tolist()} is not the same as on the first call "
                                 f"({self.classes_.tolist()})")
        if not first:
            return self.classes_
        classes = np.unique(y) if classes is None else classes
        if len(classes) < 2:
            raise ValueError("partial_fit needs at least two classes: pass classes=[...] on the "
                             "first call")
        return classes

    def _check_validation_data(self):
        """``validation_data`` as (X_val, y_val) with the training data's features and labels among
        ``classes_``, checked before training starts."""
        if self.validation_data is None:
            return
        try:
            Xv, yv = self.validation_data
        except (TypeError, ValueError):
            raise ValueError("validation_data must be a pair (X_val, y_val)") from None
        try:
            Xv = self._check_X(Xv, fitting=False)
            yv = self._check_y(yv, Xv.shape[0])
        except ValueError as exc:
            raise ValueError(f"validation_data: {exc}") from None
        unknown = np.setdiff1d(np.unique(yv), self.classes_)
        if len(unknown):
            raise ValueError(f"validation_data: y_val has labels {unknown.tolist()} that are not "
                             f"classes of y ({self.classes_.tolist()})")

    # -- the training defaults ---------------------------------------------------------------------
    def _damping(self, per_row_minibatch):
        """``damping``, or None's default: 1 for minibatches with per-row sites, else 0.5."""
        if self.damping is not None:
            return self.damping
        return 1.0 if per_row_minibatch else 0.5

    def _minibatch_rows(self, n):
        """The rows of a minibatch for n training rows, or None for batch training: ``batch_size``
        below n, or with "auto" AUTO_BATCH_SIZE rows from AUTO_MINIBATCH_FROM rows on (where
        ``_auto_minibatches()``)."""
        size = self.batch_size
        if isinstance(size, str):
            size = (AUTO_BATCH_SIZE if n >= AUTO_MINIBATCH_FROM and self._auto_minibatches()
                    else None)
        return size if size is not None and size < n else None

    def _epochs(self, n, minibatch):
        """``max_iter``, or for "auto" enough minibatch epochs to see about AUTO_ROWS rows (at
        least AUTO_MIN_EPOCHS) and in batch AUTO_BATCH_EPOCHS; a batch trainer that can stop on
        convergence (a ``tol``, batch EP) is given AUTO_SITE_TOL and stops at the first pass that
        moves no site by more than it, within AUTO_FIXED_EPOCHS passes where nothing is learnt
        (θ, Z and the label noise fixed) and AUTO_BATCH_EPOCHS steps otherwise."""
        if not isinstance(self.max_iter, str):
            return int(self.max_iter)
        if minibatch is None:
            trainer = getattr(self, "_trainer", None)      # None before a fit sets it up
            if getattr(trainer, "tol", False) is None:
                trainer.tol = AUTO_SITE_TOL
                if not any(state.learns for state in trainer.states):
                    return AUTO_FIXED_EPOCHS
            return AUTO_BATCH_EPOCHS
        return int(min(AUTO_BATCH_EPOCHS, max(AUTO_MIN_EPOCHS, -(-AUTO_ROWS // n))))

    def _engine_threads(self):
        """The engine's threads for training: n_jobs from the thread policy's size of a step's
        pass on (gpc._threads.engine_threads), else one."""
        return _threads.engine_threads("blocks", getattr(self, "_step_work", 0), self.n_jobs)

    # -- fitting -----------------------------------------------------------------------------------
    def _fit(self, X, y):
        """``fit``: Z and the kernels initialised, then ``max_iter`` epochs of training."""
        X = cast(np.ndarray, self._check_X(X, fitting=True))
        y = self._check_y(y, X.shape[0])
        setup = self._check_params()
        classes = np.unique(y)
        if len(classes) < 2:
            raise ValueError(f"only one class ({plain(classes[0])!r}) is present in y; GP classification "
                             "needs at least two classes")
        self._begin_fit(X, y, classes, setup)
        self._train(X, y, self._epochs(X.shape[0], self._batch))
        return self

    def _partial_fit(self, X, y, classes):
        """``partial_fit``: a fit of one epoch on an unfitted estimator, else one more epoch on
        the rows of the first fit (any rows when the trainer ``streams``)."""
        first = not hasattr(self, self._fitted_attribute)
        X = cast(np.ndarray, self._check_X(X, fitting=first))
        y = self._check_y(y, X.shape[0])
        if first:
            setup = self._check_params()
        classes = cast(np.ndarray, self._partial_fit_classes(y, classes, first))
        unknown = np.setdiff1d(np.unique(y), classes)
        if len(unknown):
            raise ValueError(f"y has classes {unknown.tolist()} not in classes_ "
                             f"{classes.tolist()}")
        if first:
            self._begin_fit(X, y, classes, setup)
        elif not getattr(self, "_sites_home", True):
            raise ValueError("the sites of this model's interrupted distributed fit stayed on its "
                             "cluster, which is gone: partial_fit cannot continue it; call fit")
        elif not self._trainer.streams and X.shape[0] != self._trainer.states[0].n:
            raise ValueError(f"partial_fit continues the fit of {self._trainer.states[0].n} rows "
                             f"(its sites are per row); got {X.shape[0]} rows")
        self._train(X, y, self._trainer.partial_epochs)
        return self

    def _begin_fit(self, *args):
        """``_start_fit(*args)`` with BLAS as in every later step (the first K_uu factors then
        have the same bits whatever the caller's BLAS threads); a set-up that does not finish (an
        error, an interrupt) leaves the estimator unfitted, not half set up."""
        try:
            with _threads.blas("blocks"):
                self._start_fit(*args)
        except BaseException:
            self._unfit()
            raise

    def _start_fit(self, X, y, classes, setup):
        """The model before training: classes, Z and the kernels, the minibatch size, the model
        and its trainer (``_initial_model``, ``_new_trainer``), an empty history."""
        self.classes_, self.n_features_in_ = classes, X.shape[1]
        self._check_validation_data()
        rng = self._rng()
        Z, kernels = self._initial_model(X, rng)
        for kernel in kernels:
            check_kernel_start(kernel, self.optimize_inducing)
        n = X.shape[0]
        self._batch = self._minibatch_rows(n)
        #: one problem's pass over a step's rows (the thread policy's "blocks" size)
        self._step_work = (self._batch or n) * Z.shape[-2] ** 2
        self._threads = self._engine_threads()
        self._trainer = self._new_trainer(X, y, setup, Z, kernels, rng)
        self.history_ = []
        self._sites_home = True
        self._start = time.perf_counter()

    def _train(self, X, y, epochs):
        """``epochs`` epochs of the trainer on (X, y), each recorded in ``history_``.

        A KeyboardInterrupt keeps the last completed step (a RuntimeWarning); an error keeps it
        if ``_has_model()``; either leaves the estimator unfitted when there is no valid model."""
        self._threads = self._trainer.n_jobs = self._engine_threads()
        states = self._trainer.states
        rows = None
        interrupted = False
        bar = None
        self._training = True
        try:
            try:
                rows = self._training_rows(X, y)
                bar = self._progress_bar(epochs, self._trainer.steps_per_epoch(rows))
                self._trainer.train(rows, epochs, bar.update, self._record)
            except KeyboardInterrupt:
                interrupted = True
            finally:
                self._training = False
                if bar is not None:
                    bar.close()
                if rows is not None:
                    self._sites_home = rows.close(states, interrupted)
        except Exception:
            if not self._has_model():         # a failed fit leaves no half-made model behind
                self._unfit()
            raise
        if interrupted and not self._has_model():
            # before the first completed step there is no model to keep
            self._unfit()
            raise KeyboardInterrupt("fit interrupted before its first completed step: the "
                                    "estimator is not fitted")
        if interrupted and not self._sites_home:
            warnings.warn("fit interrupted: the model keeps its last completed step (θ, Z and q "
                          "predict as they did), but the cluster did not give its per-row sites "
                          "back (a Ctrl-C in the terminal of a LocalCluster stops its workers "
                          "too), so partial_fit cannot continue this fit: call fit again",
                          RuntimeWarning, stacklevel=5)
        elif interrupted:
            warnings.warn("fit interrupted: the model keeps its last completed step",
                          RuntimeWarning, stacklevel=5)
        self._check_minibatch_evidence()

    def _check_minibatch_evidence(self):
        """Warn when a minibatch fit's log evidence, the mean of its last epoch's minibatch
        estimates, is above 0, which no probability of the labels can be: each estimate scales
        one minibatch's terms to all rows, and on small data early in training their noise can
        exceed the value.  The estimate is reported as it is, with this warning."""
        if self._batch is None:
            return
        value = self.log_marginal_likelihood_value_
        if value > 0:
            warnings.warn(f"the log evidence estimate of the last epoch's minibatches is "
                          f"{value:.4g}, above 0: the minibatch estimates' noise exceeds their "
                          "value; train longer, use larger minibatches (batch_size) or batch "
                          "training (batch_size=None) for a log evidence to compare",
                          ConvergenceWarning, stacklevel=6)

    def _has_model(self):
        """Whether every state has completed a step (L-BFGS-B: an evaluation), so the states hold
        a model whose attributes are valid: a finite log Z each."""
        return all(np.isfinite(state.log_z) for state in self._trainer.states)

    def _unfit(self):
        """Back to an unfitted estimator (the policy of ``_train``: no model is better than an
        invalid one)."""
        for name in (self._fitted_attribute,) + self._FIT_STATE:
            if name in self.__dict__:
                delattr(self, name)

    # -- the history -------------------------------------------------------------------------------
    def _progress_bar(self, epochs, steps_per_epoch):
        """What ``_train`` tells of each step (``update()``) and of the end (``close()``): a tqdm bar
        with ``progress``; the experiments score held-out rows there between epochs."""
        return _Progress(self.progress, epochs * steps_per_epoch)

    def _validation_scores(self):
        """(error, mean negative log predictive probability) on ``validation_data``."""
        Xv, yv = self.validation_data
        proba = self.predict_proba(Xv)
        index = np.searchsorted(self.classes_, np.asarray(yv))
        p = proba[np.arange(len(index)), np.clip(index, 0, len(self.classes_) - 1)]
        return (float(np.mean(self.classes_[np.argmax(proba, axis=1)] != yv)),
                float(-np.mean(np.log(np.maximum(p, 1e-300)))))

    def _record(self, objective):
        entry = {"iteration": len(self.history_) + 1,
                 "seconds": time.perf_counter() - self._start,
                 "objective": objective,
                 "reverted": sum(s.reverted for s in self._trainer.states)}
        if self.validation_data is not None:
            entry["val_error"], entry["val_nll"] = self._validation_scores()
        self.history_.append(entry)
        if self.verbose:
            print(", ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                            for k, v in entry.items()))

    # -- fitted attributes -------------------------------------------------------------------------
    @property
    def n_iter_(self):
        """Epochs completed (``fit`` and ``partial_fit`` together)."""
        self._check_fitted()
        return len(self.history_)

    @property
    def log_marginal_likelihood_value_(self):
        """log Z at the last step, summed over the model's states."""
        self._check_fitted()
        return float(sum(state.log_z for state in self._trainer.states))

    # -- prediction --------------------------------------------------------------------------------
    def _row_blocks(self, X, fn, block_rows=BLOCK_ROWS):
        """``fn(Xb, (a, b))`` of each block of ``block_rows`` rows of X (checked), inside
        gpc._parallel.block_threads: BLAS on one thread per call, the engine's blocks on
        ``n_jobs`` threads (during training, the training's), so the results are the same bits
        whatever ``n_jobs``."""
        X = self._check_X(X, fitting=False)
        threads = self._threads if getattr(self, "_training", False) else self._n_jobs()
        with _parallel.block_threads(threads):
            return [fn(as_block(X, a, b), (a, b)) for a, b in block_ranges(X.shape[0], block_rows)]

    def predict(self, X: ArrayLike) -> np.ndarray:
        """The class with the largest predictive probability."""
        self._check_fitted()
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]

    # -- clone and pickling ------------------------------------------------------------------------
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
